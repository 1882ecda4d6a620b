// Package redact removes secrets from free text before it reaches status
// files, log lines, events or API answers. It is a leaf: the standard
// library only.
package redact

import (
	"regexp"
	"strings"
)

// String removes secrets from free text before it reaches status, a log
// line or an event: the password of "scheme://user:password@" in URLs,
// values after password=, passwd=, pwd=, pass=, secret=, token=,
// access_token=, api_key=, apikey= and authorization= (also with ":" and
// quoted), and the credential after "Bearer " or "Basic ". Each is
// replaced by "***". It is a safety net: callers should not put secrets in
// messages in the first place.
func String(s string) string {
	if !mayHoldSecret(s) {
		return s
	}
	s = urlPassword.ReplaceAllString(s, "${1}:***@")
	s = authScheme.ReplaceAllString(s, "${1} ***")
	s = keyValueSecret.ReplaceAllString(s, "${1}${2}***")
	return s
}

// secretWords are lower-case substrings every pattern of String needs;
// text with none of them (and no '@') is returned as is, without regexps.
var secretWords = []string{"pass", "pwd", "secret", "token", "key", "authorization", "bearer", "basic"}

func mayHoldSecret(s string) bool {
	if s == "" {
		return false
	}
	if strings.IndexByte(s, '@') >= 0 {
		return true
	}
	l := strings.ToLower(s)
	for _, w := range secretWords {
		if strings.Contains(l, w) {
			return true
		}
	}
	return false
}

var (
	urlPassword    = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^/\s@]+@`)
	keyValueSecret = regexp.MustCompile(`(?i)\b(password|passwd|pwd|pass|secret|client_secret|token|access_token|refresh_token|api[_-]?key|apikey|authorization)(["']?\s*[=:]\s*)("[^"]*"|'[^']*'|[^\s&,;"']+)`)
	authScheme     = regexp.MustCompile(`(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}`)
)
