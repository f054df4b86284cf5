package layer

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"liken.sh/liken/apis/liken/v1alpha1"
	"liken.sh/liken/cli/internal/cmdutil"
)

// PackOptions says what goes into a layer.
type PackOptions struct {
	// Files are YAML files, or directories of .yaml/.yml/.json files,
	// holding one Cluster and its Machines.
	Files []string
	// IdentityDir is a directory written by liken layer generate.
	IdentityDir string
	// TokenTTL is how long each worker's own join token is valid
	// (DefaultJoinTokenTTL when zero).
	TokenTTL time.Duration
	// SharedJoinToken makes every machine join with the identity's join
	// token, which may then ask for any Machine's certificate, instead of
	// a token of its own.
	SharedJoinToken bool
	// Now is when the tokens' lifetime starts (time.Now when zero).
	Now time.Time
	// Rand makes the tokens (crypto/rand when nil).
	Rand io.Reader
}

// PackError lists every problem found while assembling a layer.
type PackError struct {
	// Problems are the individual errors, each naming its file, document
	// and field.
	Problems []error
}

func (e *PackError) Error() string {
	var b strings.Builder
	if len(e.Problems) == 1 {
		b.WriteString("1 problem")
	} else {
		fmt.Fprintf(&b, "%d problems", len(e.Problems))
	}
	b.WriteString(" (nothing was written):")
	for _, p := range e.Problems {
		for i, line := range strings.Split(p.Error(), "\n") {
			if i == 0 {
				b.WriteString("\n  - " + line)
			} else {
				b.WriteString("\n    " + line)
			}
		}
	}
	return b.String()
}

// Assemble reads and validates every input of a layer and returns the
// layer, or a *PackError with every problem found. It writes nothing.
func Assemble(opts PackOptions) (*Layer, error) {
	var problems []error
	if len(opts.Files) == 0 {
		problems = append(problems, errors.New("no documents given: pass the Cluster and Machine documents with -f FILE (repeat it, or give a directory)"))
	}
	if opts.IdentityDir == "" {
		problems = append(problems, errors.New("no identity given: pass --identity DIR (liken layer generate DIR creates one)"))
	}
	var docs []*Document
	for _, f := range opts.Files {
		files, err := expandInput(f)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		for _, file := range files {
			b, err := readRegularFile(file, maxDocumentFile)
			if err != nil {
				problems = append(problems, err)
				continue
			}
			d, errs := ParseDocuments(file, strings.NewReader(string(b)))
			docs = append(docs, d...)
			problems = append(problems, errs...)
		}
	}
	var l *Layer
	cluster, machines, errs := CheckFleet(docs)
	if len(problems) == 0 {
		problems = append(problems, errs...)
		l = &Layer{Cluster: cluster, Machines: machines}
	} else {
		// With invalid documents, only the problems of valid Machines are
		// certain (a missing Cluster may just be an invalid one).
		for _, e := range errs {
			if _, ok := e.(*DocumentError); ok {
				problems = append(problems, e)
			}
		}
	}
	if opts.IdentityDir != "" {
		id, err := LoadIdentity(opts.IdentityDir)
		if err != nil {
			problems = append(problems, err)
		} else if l != nil {
			l.Identity = id
		}
	}
	switch {
	case opts.TokenTTL < 0:
		problems = append(problems, fmt.Errorf("--join-token-ttl %s: a join token's lifetime must be more than 0", opts.TokenTTL))
	case opts.TokenTTL == 0:
		opts.TokenTTL = DefaultJoinTokenTTL
	}
	if len(problems) > 0 {
		return nil, &PackError{Problems: problems}
	}
	l.SharedJoinToken = opts.SharedJoinToken
	if !l.SharedJoinToken {
		if opts.Now.IsZero() {
			opts.Now = time.Now()
		}
		tokens, err := MachineTokens(l.Machines, opts.Now.Add(opts.TokenTTL), opts.Rand)
		if err != nil {
			return nil, err
		}
		l.Tokens = tokens
	}
	return l, nil
}

// expandInput turns a -f argument into files: the file itself, or a
// directory's .yaml, .yml and .json files (not recursive), sorted.
func expandInput(p string) ([]string, error) {
	st, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return []string{p}, nil
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		switch strings.ToLower(filepath.Ext(e.Name())) {
		case ".yaml", ".yml", ".json":
			if !e.IsDir() {
				out = append(out, filepath.Join(p, e.Name()))
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no .yaml, .yml or .json files", p)
	}
	sort.Strings(out)
	return out, nil
}

// Leaders counts the layer's Machines whose role is Leader.
func (l *Layer) Leaders() int {
	n := 0
	for _, m := range l.Machines {
		if m.Machine.Spec.Role == v1alpha1.RoleLeader {
			n++
		}
	}
	return n
}

// EvenLeadersWarning says why an even number of leaders adds no margin
// over one leader fewer: the datastore answers only while a majority of
// its members do, so 2 leaders survive no failure, as 1 does, and 4
// survive one, as 3 do. It is "" for an odd number of leaders (or none).
func EvenLeadersWarning(leaders int) string {
	if leaders <= 0 || leaders%2 != 0 {
		return ""
	}
	majority := leaders/2 + 1
	survives := "no leader down"
	if down := leaders - majority; down > 0 {
		survives = cmdutil.Plural(down, "leader", "leaders") + " down"
	}
	return fmt.Sprintf("%d leaders survive no more failures than %s: the datastore needs a majority of its leaders (%d of %d) to answer, "+
		"so it survives %s, as %s, and the extra leader is one more machine that can fail. "+
		"Use %d or %d leaders now: a Machine's role cannot change later without installing the machine again",
		leaders, cmdutil.Plural(leaders-1, "leader", "leaders"), majority, leaders,
		survives, cmdutil.Plural(leaders-1, "leader does", "leaders do"), leaders-1, leaders+1)
}
