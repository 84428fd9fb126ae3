package llmretrytest

import "strconv"

// This file holds how an answer breaks partway: the steps that stream
// part of an answer and then fail, for tests of what a client does with
// the part it holds (continuation among them).

// faultKind is how an answer breaks partway. The zero value is none.
type faultKind uint8

const (
	noFault     faultKind = iota
	faultDrop             // the connection is cut
	faultStall            // nothing more is sent
	faultGarble           // an event that does not decode, then the end
	faultError            // an error inside the stream, then the end
)

// name is how Step.String names the fault; errType is FailAfter's.
func (f faultKind) name(errType string) string {
	switch f {
	case faultDrop:
		return "drop"
	case faultStall:
		return "stall"
	case faultGarble:
		return "garble"
	case faultError:
		return "error " + errType
	}
	return "fault(" + strconv.Itoa(int(f)) + ")"
}

// DropAfter returns a copy of s, an [Answer], [Truncated] or [Refuse],
// whose stream sends its first n chunks of text and then cuts the
// connection, as a provider or a proxy that drops a stream does: the
// client's read fails with an unexpected EOF. Unlike [StreamDrop], the
// text is the answer's own, so a client that continues the answer
// ([Server] speaks continuation) can finish it: the next request plays
// the next step, and n counts the chunks that request sends, after what
// it continues. n at or past the answer's chunks breaks the stream after
// its last text, before it ends (Gemini, whose last text carries the
// end, then plays it whole). A request that did not ask for a stream
// gets its JSON body cut halfway. DropAfter panics if n is negative or s
// has no answer's text.
func (s Step) DropAfter(n int) Step { return s.breaking("DropAfter", n, faultDrop, "") }

// StallAfter is as [Step.DropAfter], but the stream sends nothing more
// after its first n chunks, until the client goes away or the server is
// closed; a request that did not ask for a stream gets the status line
// and headers and then the same stall.
func (s Step) StallAfter(n int) Step { return s.breaking("StallAfter", n, faultStall, "") }

// GarbleAfter is as [Step.DropAfter], but after its first n chunks the
// stream sends an event whose data is JSON cut off halfway, as a proxy
// that mangles an event does, and then ends; a request that did not ask
// for a stream gets a JSON body cut off halfway.
func (s Step) GarbleAfter(n int) Step { return s.breaking("GarbleAfter", n, faultGarble, "") }

// FailAfter is as [Step.DropAfter], but after its first n chunks the
// stream reports an error of errType inside it, as [StreamError] does
// (an overload is "overloaded_error" for Anthropic, "server_error" for
// OpenAI, "UNAVAILABLE" for Gemini), and then ends; a request that did
// not ask for a stream gets the HTTP error errType stands for.
func (s Step) FailAfter(n int, errType string) Step {
	return s.breaking("FailAfter", n, faultError, errType)
}

// breaking is s breaking after n chunks as f says; name is the method
// that asked, for its panic.
func (s Step) breaking(name string, n int, f faultKind, errType string) Step {
	switch {
	case n < 0:
		panic("llmretrytest: " + name + "(" + strconv.Itoa(n) + "): negative chunk count")
	case s.kind != kindAnswer && s.kind != kindTruncated && s.kind != kindRefused:
		panic("llmretrytest: " + name + " on " + s.String() + ", which has no answer's text")
	}
	s.fault, s.faultAt, s.faultType = f, n, errType
	return s
}

// plain is s without its fault: the answer as it would have been whole.
func (s Step) plain() Step {
	s.fault, s.faultAt, s.faultType = noFault, 0, ""
	return s
}

// breaksAt reports whether s's stream breaks before its chunk i, of n in
// all: at its fault's chunk, or, for a fault at or past the last chunk,
// once the text is all sent (i == n).
func (s Step) breaksAt(i, n int) bool {
	return s.fault != noFault && i == min(s.faultAt, n)
}

// broken breaks the stream as st's fault says, garble and fail writing
// the endpoint's own garbled event and error; it returns what a stream
// writer returns: false when the connection is to be cut.
func (x *exchange) broken(st Step, garble, fail func() bool) bool {
	switch st.fault {
	case faultStall:
		x.stall()
		return false
	case faultGarble:
		return garble()
	case faultError:
		return fail()
	}
	return false // faultDrop
}
