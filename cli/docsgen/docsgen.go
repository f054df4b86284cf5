// Package docsgen writes the reference pages of the liken command line from the commands themselves: one Markdown page per command and an index.
package docsgen

import (
	"bytes"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// IndexPage is the name of the index page (a folder's page on GitHub and
// most documentation sites).
const IndexPage = "README.md"

// header marks every page as generated.
const header = "<!-- Generated from the commands by `go test ./cli/docsgen -update`. Do not edit. -->\n\n"

// Pages returns every reference page, keyed by file name: the index and one
// page per visible command (liken_layer_pack.md for liken layer pack).
func Pages(root *cobra.Command) map[string][]byte {
	root.InitDefaultCompletionCmd()
	pages := map[string][]byte{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if !visible(c) {
			return
		}
		pages[PageName(c)] = commandPage(c)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	pages[IndexPage] = indexPage(root)
	return pages
}

// PageName is the file name of a command's page.
func PageName(c *cobra.Command) string {
	return strings.ReplaceAll(c.CommandPath(), " ", "_") + ".md"
}

func visible(c *cobra.Command) bool {
	return !c.Hidden && !c.IsAdditionalHelpTopicCommand() && c.Name() != "help" && c.Deprecated == ""
}

func children(c *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	for _, s := range c.Commands() {
		if visible(s) {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

func commandPage(c *cobra.Command) []byte {
	var b bytes.Buffer
	b.WriteString(header)
	fmt.Fprintf(&b, "# %s\n\n", c.CommandPath())
	fmt.Fprintf(&b, "%s.\n\n", strings.TrimSuffix(c.Short, "."))
	if c.Long != "" {
		fmt.Fprintf(&b, "%s\n\n", markdown(c.Long))
	}
	if c.Runnable() {
		fmt.Fprintf(&b, "## Usage\n\n```\n%s\n```\n\n", c.UseLine())
	}
	if c.Example != "" {
		fmt.Fprintf(&b, "## Examples\n\n```sh\n%s\n```\n\n", strings.TrimRight(c.Example, "\n"))
	}
	if kids := children(c); len(kids) > 0 {
		b.WriteString("## Commands\n\n| command | what it does |\n| --- | --- |\n")
		for _, k := range kids {
			fmt.Fprintf(&b, "| [%s](%s) | %s |\n", k.CommandPath(), PageName(k), k.Short)
		}
		b.WriteString("\n")
	}
	if fs := ownFlags(c); fs.HasAvailableFlags() {
		fmt.Fprintf(&b, "## Options\n\n```\n%s```\n\n", fs.FlagUsages())
	}
	if c.HasParent() {
		fmt.Fprintf(&b, "Every command also takes the global options: see [liken options](%s).\n\n", "liken_options.md")
		p := c.Parent()
		fmt.Fprintf(&b, "Part of [%s](%s).\n", p.CommandPath(), PageName(p))
	} else {
		fmt.Fprintf(&b, "## Global options\n\nEvery command takes these options, as kubectl does:\n\n```\n%s```\n", c.PersistentFlags().FlagUsages())
	}
	return b.Bytes()
}

func indexPage(root *cobra.Command) []byte {
	var b bytes.Buffer
	b.WriteString(header)
	b.WriteString(`# The liken command line

` + "`liken`" + ` packs deployment layers, approves and requests reboots, follows
rollouts, and runs a whole fleet on one computer (the lab). The commands
that talk to a cluster take the kubeconfig options kubectl takes
(` + "`--kubeconfig`, `--context`, ..." + `; see [liken options](liken_options.md)) and
read ` + "`KUBECONFIG`" + ` the same way.

Every command exits 0 when it succeeded and 1 when it did not, with a
message on standard error that says what was wrong and what to do. A
command stopped by Ctrl-C or SIGTERM prints ` + "`error: interrupted`" + ` and exits 130.
` + "`liken rollout status`" + ` also exits 1 when cluster-operator halts the rollout.
` + "`liken completion bash|zsh|fish|powershell`" + ` prints a completion script; with it,
cluster and machine names complete from the cluster.

| command | what it does |
| --- | --- |
`)
	for _, k := range children(root) {
		fmt.Fprintf(&b, "| [%s](#%s) | %s |\n", k.CommandPath(), anchor(k.CommandPath()), k.Short)
	}
	for _, k := range children(root) {
		fmt.Fprintf(&b, "\n## %s\n\n", k.CommandPath())
		fmt.Fprintf(&b, "%s.\n\n", strings.TrimSuffix(k.Short, "."))
		if k.Runnable() {
			fmt.Fprintf(&b, "```\n%s\n```\n\n", k.UseLine())
		}
		if kids := children(k); len(kids) > 0 {
			for _, kk := range kids {
				fmt.Fprintf(&b, "- [%s](%s): %s\n", kk.CommandPath(), PageName(kk), kk.Short)
			}
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "Reference: [%s](%s).\n", k.CommandPath(), PageName(k))
	}
	return b.Bytes()
}

// markdown turns help text into Markdown: runs of indented lines become
// code blocks, and < > in prose are escaped so placeholders such as
// <name> show.
func markdown(text string) string {
	var out []string
	inCode := false
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		indented := strings.HasPrefix(line, "  ") || strings.HasPrefix(line, "\t")
		switch {
		case indented && !inCode:
			out = append(out, "```")
			inCode = true
		case !indented && inCode:
			out = append(out, "```")
			inCode = false
		}
		if inCode {
			out = append(out, strings.TrimPrefix(strings.TrimPrefix(line, "\t"), "  "))
			continue
		}
		out = append(out, strings.NewReplacer("<", "&lt;", ">", "&gt;").Replace(line))
	}
	if inCode {
		out = append(out, "```")
	}
	return strings.Join(out, "\n")
}

// anchor is the heading anchor GitHub and most site generators derive from
// a heading: lower case, spaces to dashes.
func anchor(heading string) string {
	return strings.ToLower(strings.ReplaceAll(heading, " ", "-"))
}

// ownFlags are the command's own options, without --help.
func ownFlags(c *cobra.Command) *pflag.FlagSet {
	fs := pflag.NewFlagSet(c.Name(), pflag.ContinueOnError)
	c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" {
			fs.AddFlag(f)
		}
	})
	return fs
}
