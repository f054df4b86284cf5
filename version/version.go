// Package version holds liken's version, set at build time.
package version

// Version is liken's version, set with -ldflags at build time.
var Version = "dev"
