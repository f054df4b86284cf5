// Package clip cuts messages to the length a status field holds.
package clip

import "unicode/utf8"

// To returns s cut to at most n bytes on a character boundary, ending in
// "..." when it was cut.
func To(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := max(n-len("..."), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
