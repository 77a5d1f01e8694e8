package boot

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// Flags is a command's flag set with the flags every command has: -config
// and -version. Its usage and errors go to stdout.
type Flags struct {
	*flag.FlagSet
	// Config is the -config path, "" when not given.
	Config  *string
	version *bool
	stdout  io.Writer
}

// NewFlags returns the flag set of command name ("gateway", "analytics
// serve"); configUsage says whether -config is required.
func NewFlags(name, configUsage string, stdout io.Writer) *Flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	return &Flags{
		FlagSet: fs,
		Config:  fs.String("config", "", configUsage),
		version: fs.Bool("version", false, "print the version and exit"),
		stdout:  stdout,
	}
}

// Parse parses args. After -version it has printed the version, and done
// says the command has nothing more to do.
func (f *Flags) Parse(args []string) (done bool, err error) {
	if err := f.FlagSet.Parse(args); err != nil {
		return true, err
	}
	if *f.version {
		command, _, _ := strings.Cut(f.Name(), " ")
		_, err := fmt.Fprintln(f.stdout, VersionLine(command))
		return true, err
	}
	return false, nil
}
