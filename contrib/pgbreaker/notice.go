package pgbreaker

import (
	"encoding/base64"
	"strconv"
	"strings"
)

// stateChannel is the NOTIFY channel whose notices carry the row they
// announce, so that a Breaker takes the new state from the notice rather
// than load it (llmretry.StateNotifier). Every write notifies it and
// channel both: a process of an earlier version of this package listens
// on channel alone, and a fleet in the middle of an upgrade still hears
// every write.
const stateChannel = "llmretry_breaker_state"

// maxNotice bounds a state notice's payload: PostgreSQL refuses one of
// 8,000 bytes or more, and a statement whose NOTIFY it refused fails.
// A row too big for it is announced without its state. The bound is
// on the key and the state in base64; the rest of the payload (a letter,
// the table's oid, the version) takes less than 100 bytes more. A
// string, as swapSQL writes it.
const maxNotice = "7900"

// notice is what one notice on stateChannel says: the table written (a
// database's processes may keep rows in tables of several schemas, and
// the channel is the database's), the key, its version after the write,
// and the state when the payload carries it.
type notice struct {
	table   uint32
	key     string
	version int64
	state   []byte
	carried bool
}

// parseNotice reads a payload that swapSQL wrote on stateChannel:
//
//	s<table's oid>:<version>:<state in base64>:<key>
//	n<table's oid>:<version>:<key>
//
// The second is a row too big for a notice. The key comes last, as it
// may hold colons (base64 does not). It reports false for any other
// payload.
func parseNotice(payload string) (notice, bool) {
	if len(payload) == 0 || payload[0] != 's' && payload[0] != 'n' {
		return notice{}, false
	}
	carried := payload[0] == 's'
	table, rest, ok1 := strings.Cut(payload[1:], ":")
	ver, rest, ok2 := strings.Cut(rest, ":")
	oid, err1 := strconv.ParseUint(table, 10, 32)
	v, err2 := strconv.ParseInt(ver, 10, 64)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || oid == 0 || v <= 0 {
		return notice{}, false
	}
	out := notice{table: uint32(oid), key: rest, version: v, carried: carried}
	if !carried {
		return out, true
	}
	b64, key, ok := strings.Cut(rest, ":")
	state, err := base64.StdEncoding.DecodeString(b64)
	if !ok || err != nil {
		return notice{}, false
	}
	out.key, out.state = key, state
	return out, true
}
