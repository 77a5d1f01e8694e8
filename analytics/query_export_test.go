package analytics

import (
	"io/fs"
	"path"
	"strings"
)

// Queries returns every embedded query as it runs ({key_filters} spliced),
// by file name.
func Queries() map[string]string {
	files, err := fs.Glob(sqlFS, "sql/*.sql")
	if err != nil {
		panic(err)
	}
	qs := make(map[string]string, len(files))
	for _, f := range files {
		name := path.Base(f)
		qs[name] = mustSQL(strings.TrimSuffix(name, ".sql"))
	}
	return qs
}

// MaxRows is the most rows any answer holds.
const MaxRows = maxRows
