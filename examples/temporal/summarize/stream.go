package summarize

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/llmretry/llmretry"
)

// readStream reads an OpenAI chat completion stream whole and returns its
// text, telling the chain of each chunk with llmretry.Progress. A stream
// that stops at its token budget is a truncation, which no run repeats.
func readStream(ctx context.Context, body io.Reader) (string, error) {
	var text strings.Builder
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return text.String(), nil
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return "", llmretry.ParseFailure(data, fmt.Errorf("reading the stream: %w", err))
		}
		for _, c := range chunk.Choices {
			text.WriteString(c.Delta.Content)
			llmretry.Progress(ctx)
			if c.FinishReason == "length" {
				return "", llmretry.Truncation(text.String())
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", io.ErrUnexpectedEOF // the stream ended without [DONE]
}
