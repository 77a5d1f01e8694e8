package boot

import (
	"bytes"
	"crypto/sha256"
	"os"
)

// FileWatch tells when a configuration file's content has changed. It is
// polled (Changed, every second or two) rather than notified, because the
// ways files get replaced defeat per-file notifications: an editor's or a
// config tool's rename over the file, and the symlink swap by which
// Kubernetes updates a mounted ConfigMap (the file is a symlink to
// ..data/<name>, and ..data is a symlink renamed atomically onto a new
// timestamped directory). Reading through the path follows the symlinks to
// whatever they point at now, and comparing the content's hash sees every
// one of these, and nothing else: touching a file or re-creating it with
// the same bytes is no change.
//
// A FileWatch is not safe for concurrent use; one reload loop owns it.
type FileWatch struct {
	path string
	hash func() ([]byte, bool) // the content's hash, false when unreadable
	sum  []byte                // of the content last seen; nil: none read yet
}

// NewFileWatch watches path, taking its current content as seen.
func NewFileWatch(path string) *FileWatch {
	return NewWatch(path, func() ([]byte, bool) { return fileSum(path) })
}

// NewWatch watches content other than one file's, e.g. a directory of
// files, by the hash sum returns (false: unreadable for now, no change);
// name is its Path.
func NewWatch(name string, sum func() ([]byte, bool)) *FileWatch {
	w := &FileWatch{path: name, hash: sum}
	w.Seen()
	return w
}

// Path is the watched path.
func (w *FileWatch) Path() string { return w.path }

// Seen records the file's current content as seen, so Changed does not
// report it: call it when the file is (re)loaded for another reason, such
// as SIGHUP.
func (w *FileWatch) Seen() {
	if sum, ok := w.hash(); ok {
		w.sum = sum
	}
}

// Changed reports whether the file's content differs from what was last
// seen, and records it as seen. A file that cannot be read (gone for a
// moment, mid-swap) is no change: the running configuration stays, and
// the next poll looks again.
func (w *FileWatch) Changed() bool {
	sum, ok := w.hash()
	if !ok || bytes.Equal(sum, w.sum) {
		return false
	}
	w.sum = sum
	return true
}

func fileSum(path string) ([]byte, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	sum := sha256.Sum256(b)
	return sum[:], true
}
