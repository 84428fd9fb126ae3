package llmretry

import (
	"regexp"
	"strings"
)

// Redact returns s with the secrets that commonly leak into error messages
// and records replaced by the word REDACTED, so that the text can be
// logged or shown. It replaces:
//
//   - the userinfo of a URL: "https://user:pass@host/" becomes
//     "https://REDACTED@host/";
//   - the value of a query parameter named key, api_key, apikey, api-key,
//     access_token, token, sig, signature, secret, client_secret or
//     password, in any letter case: "?key=abc&alt=sse" becomes
//     "?key=REDACTED&alt=sse";
//   - the token after "Bearer " (any case): "Authorization: Bearer abc"
//     becomes "Authorization: Bearer REDACTED";
//   - a standalone provider key: "sk-" followed by at least 16 key
//     characters (OpenAI, Anthropic) and "AIza" followed by at least 30
//     (Google), where key characters are ASCII letters, digits, '_' and '-'.
//
// URLs are found anywhere in the text, quoted or not. Redact works on
// plain text: a secret that is percent-encoded, base64-encoded or split
// across lines is not found, nor is a userinfo holding a raw '/', '?' or
// '#' (which a valid URL percent-encodes). Where text is ambiguous it
// hides too much rather than too little: "invalid bearer token" becomes
// "invalid bearer REDACTED".
//
// Everything this package renders from an error or a record passes
// through Redact: the texts, JSON and slog values of the chain's errors
// and of an [Attempt], its error and its raw output wherever they are
// written. The fields themselves, such as Attempt.Err and Attempt.RawText,
// keep what the backend gave.
//
// Redact is idempotent (Redact(Redact(s)) == Redact(s)), accepts any
// input, invalid UTF-8 included, without panicking, and is safe for
// concurrent use. Text in which none of these forms occurs comes back as
// it was, without allocating.
func Redact(s string) string {
	for _, r := range redactions {
		// The plain substring scan is the fast path: most text has none
		// of the triggers (a clean 90-byte message took about 0.1µs with
		// it and 6µs with MatchString alone, benchstat n=6). MatchString,
		// unlike ReplaceAllString, does not allocate, so clean text that
		// has a trigger costs no garbage either.
		if r.trigger(s) && r.re.MatchString(s) {
			s = r.re.ReplaceAllString(s, r.repl)
		}
	}
	return s
}

// redactions run in this order, which idempotence depends on. A query
// value may hold a '/', which ends a userinfo match, so query values go
// first: the userinfo rule then sees the same text on every run, and its
// own replacement cannot start a query match. The key rule goes last: it
// turns a run of key characters into another such run (REDACTED), which
// no other rule's match can start or end in differently.
var redactions = []struct {
	trigger func(string) bool // true whenever re could match
	re      *regexp.Regexp
	repl    string
}{
	{
		// A query parameter name after '?' or '&' (also "&amp;" from
		// HTML and "\u0026" from JSON, which end in ';' and '6'). The
		// value ends at '&', '#', whitespace, a quote, a backslash (the
		// start of an escape in %q or JSON output), '<' or '>', or the
		// end of the text.
		trigger: func(s string) bool { return strings.IndexByte(s, '=') >= 0 },
		re: regexp.MustCompile(`(?i)((?:[?&;]|\\u0026)` +
			`(?:key|api_key|apikey|api-key|access_token|token|sig|signature|secret|client_secret|password)=)` +
			`[^&#\s"'` + "`" + `\\<>]+`),
		repl: "${1}REDACTED",
	},
	{
		// The userinfo runs from "://" to the last '@' before the host
		// ends at '/', '?', '#' or a delimiter. Taking the last '@'
		// hides a password with a raw '@' in it whole, as net/url
		// parses it. The scheme is not matched: any scheme's userinfo
		// is a secret, and leaving it out means no character before
		// "://" can decide whether the rule fires.
		trigger: func(s string) bool { return strings.Contains(s, "://") },
		re:      regexp.MustCompile(`://[^/?#\s"'` + "`" + `\\<>]+@`),
		repl:    "://REDACTED@",
	},
	{
		// The token runs to whitespace, a quote, a backslash or a
		// closing bracket or separator that cannot be part of a token
		// (RFC 6750 allows only letters, digits and -._~+/=), so that
		// "map[Authorization:[Bearer abc]]" keeps its brackets.
		trigger: func(s string) bool { return containsFoldASCII(s, "bearer") },
		re:      regexp.MustCompile(`(?i)\b(bearer[ \t]+)[^\s"'` + "`" + `\\<>,;)\]}]+`),
		repl:    "${1}REDACTED",
	},
	{
		// A key must stand alone: the character before it, if any, is
		// not a key character, so "task-list" and "disk-1" are words,
		// not keys, and the greedy run takes the key whole. The minimum
		// lengths sit well below the real ones (OpenAI's shortest keys
		// have 48 characters after "sk-", Google's 35 after "AIza") so
		// a truncated key is still caught, and well above kebab-case
		// words and locale tags such as "sk-SK" that start the same way.
		// The prefixes are case-sensitive, as the providers issue them.
		trigger: func(s string) bool { return strings.Contains(s, "sk-") || strings.Contains(s, "AIza") },
		re:      regexp.MustCompile(`(^|[^A-Za-z0-9_-])(?:sk-[A-Za-z0-9_-]{16,}|AIza[A-Za-z0-9_-]{30,})`),
		repl:    "${1}REDACTED",
	},
}

// containsFoldASCII reports whether s contains lower, which is lower-case
// ASCII, ignoring ASCII case. It is the bearer rule's trigger; the rule's
// (?i) folds Unicode too, but no letter of "bearer" has a non-ASCII fold.
func containsFoldASCII(s, lower string) bool {
	for i := 0; i+len(lower) <= len(s); i++ {
		if s[i]|0x20 != lower[0] {
			continue // fast reject before the full comparison
		}
		if strings.EqualFold(s[i:i+len(lower)], lower) {
			return true
		}
	}
	return false
}
