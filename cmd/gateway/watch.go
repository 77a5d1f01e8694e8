package main

import (
	"bytes"
	"strings"

	"github.com/edgelimit/edgelimit/gateway/envoyrls"
)

// changeWatch tells when something a reload reads has changed
// (*boot.FileWatch, dirWatch, watches).
type changeWatch interface {
	Seen()
	Changed() bool
	Path() string
}

// dirWatch tells when the Envoy ratelimit files of a directory have
// changed, like boot.FileWatch for one file: by content, so a ConfigMap's
// symlink swap counts and a touch does not.
type dirWatch struct {
	dir string
	sum []byte
}

func newDirWatch(dir string) *dirWatch {
	w := &dirWatch{dir: dir}
	w.Seen()
	return w
}

func (w *dirWatch) Path() string { return w.dir }

func (w *dirWatch) Seen() {
	if sum, ok := envoyrls.DirSum(w.dir); ok {
		w.sum = sum
	}
}

func (w *dirWatch) Changed() bool {
	sum, ok := envoyrls.DirSum(w.dir)
	if !ok || bytes.Equal(sum, w.sum) {
		return false
	}
	w.sum = sum
	return true
}

// watches changes when any of them does; each records what it saw.
type watches []changeWatch

func (ws watches) Seen() {
	for _, w := range ws {
		w.Seen()
	}
}

func (ws watches) Changed() bool {
	changed := false
	for _, w := range ws {
		changed = w.Changed() || changed
	}
	return changed
}

func (ws watches) Path() string {
	paths := make([]string, len(ws))
	for i, w := range ws {
		paths[i] = w.Path()
	}
	return strings.Join(paths, ", ")
}
