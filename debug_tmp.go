package llmretry

import (
	"fmt"
	"os"
	"time"
)

var debugOn = os.Getenv("LLMRETRY_DEBUG") != ""

func dbg(b *Breaker, format string, args ...any) {
	if !debugOn {
		return
	}
	id := ""
	if b.fleet != nil {
		id = b.fleet.id[:4]
	}
	fmt.Fprintf(os.Stderr, "%s %s "+format+"\n", append([]any{time.Now().Format("05.000000"), id}, args...)...)
}
