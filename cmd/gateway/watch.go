package main

import (
	"strings"
)

// changeWatch tells when something a reload reads has changed
// (*boot.FileWatch, or watches of several).
type changeWatch interface {
	Seen()
	Changed() bool
	Path() string
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
