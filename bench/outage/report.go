package outage

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// WriteMarkdown writes one scenario's results as a Markdown section: a
// heading, the script in one line, and a table with one row per strategy.
func WriteMarkdown(w io.Writer, n int, sc *Scenario, results []*Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "### %d. %s\n\n%s.\n\n", n, sc.Name, sc.About)
	b.WriteString("| strategy | answered | by primary | by secondary | p50 | p95 | p99 | sent | sent/answer | billed/answer | answered 429 | early sends | parked at deadline |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s (%d) | %d | %d | %s | %s | %s | %d | %s | %s | %d | %d | %d |\n",
			r.Strategy, percent(r.Answered, r.Requests), r.Answered, r.ByPrimary, r.BySecond,
			seconds(r.P50), seconds(r.P95), seconds(r.P99),
			r.Sent, ratio(r.SentPerAnswer(), r.Answered), ratio(r.BilledPerAnswer(), r.Answered),
			r.Got429, r.Early, r.Parked)
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// percent formats n of total as a percentage with one decimal.
func percent(n, total int) string {
	if total == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(total))
}

// seconds formats a duration in seconds with one decimal.
func seconds(d time.Duration) string {
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// ratio formats a per-answer figure, or "-" when nothing was answered.
func ratio(x float64, answered int) string {
	if answered == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}
