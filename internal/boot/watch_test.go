package boot

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestFileWatch(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, name string) {
		t.Helper()
		tmp := filepath.Join(dir, name+".tmp")
		if err := os.Symlink(target, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("a", "one")
	write("b", "two")
	write("c", "two")
	link("a", "cfg")
	w := NewFileWatch(filepath.Join(dir, "cfg"))

	steps := []struct {
		name string
		do   func()
		want bool
	}{
		{"nothing", func() {}, false},
		{"touched, same bytes", func() {
			now := time.Now().Add(time.Hour)
			os.Chtimes(filepath.Join(dir, "a"), now, now)
		}, false},
		{"symlink swapped", func() { link("b", "cfg") }, true},
		{"asked again", func() {}, false},
		{"swapped to the same bytes", func() { link("c", "cfg") }, false},
		{"target gone", func() { os.Remove(filepath.Join(dir, "c")) }, false},
		{"target back, new bytes", func() { write("c", "three") }, true},
		{"written in place", func() { write("c", "four") }, true},
		{"seen by a reload", func() { write("c", "five"); w.Seen() }, false},
	}
	for _, s := range steps {
		s.do()
		if got := w.Changed(); got != s.want {
			t.Errorf("%s: Changed() = %v, want %v", s.name, got, s.want)
		}
	}
}
