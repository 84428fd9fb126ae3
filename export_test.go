package llmretry

import (
	"net/http"
	"strconv"
	"time"
)

// This file lends the external tests (package llmretry_test) what they
// check of the package's internals. Those tests are external because
// they use llmretrytest, which imports this package.

// Limits is what parseLimits read of one response, for the external
// tests.
type Limits struct {
	RequestsLimit, RequestsRemaining int64
	TokensLimit, TokensRemaining     int64
	RequestsNext                     time.Time // when the requests bucket admits the next request
	RetryAt                          time.Time // when Retry-After said to try again; zero when none
}

// ParseLimits is parseLimits, for the external tests.
func ParseLimits(h http.Header, sent, read time.Time) (Limits, bool) {
	r, ok := parseLimits(h, sent, read)
	return Limits{
		RequestsLimit: r.requests.limit, RequestsRemaining: r.requests.remaining,
		TokensLimit: r.tokens.limit, TokensRemaining: r.tokens.remaining,
		RequestsNext: r.requests.next, RetryAt: r.retryAt,
	}, ok
}

// FleetState is the part of the state that Breakers share through a
// store that the external tests read and write as another process
// would.
type FleetState struct {
	Failures   int
	Until      time.Time
	Kind       Kind
	Hinted     bool
	Opened     int
	ProbeOwner string
	ProbeUntil time.Time

	// Read only: the requests let through, those in flight, and the
	// calls waiting, in every process.
	Admitted uint64
	Back     uint64
	InFlight int64
	Waiting  int
}

// DecodeFleetState reads a stored state.
func DecodeFleetState(data []byte) (FleetState, error) {
	st, err := decodeShared(data)
	fs := FleetState{st.Fails, st.Until, st.Kind, st.Hinted, st.Opened, st.ProbeOwner, st.ProbeUntil, st.Admitted, st.Back, 0, 0}
	for _, e := range st.Procs {
		fs.InFlight += e.InFlight
		fs.Waiting += e.Waiting
	}
	return fs, err
}

// ChangeFleetState changes the health part of a stored state, keeping
// the rest.
func ChangeFleetState(data []byte, change func(*FleetState)) ([]byte, error) {
	st, err := decodeShared(data)
	if err != nil {
		return nil, err
	}
	fs, _ := DecodeFleetState(data)
	change(&fs)
	st.Fails, st.Until, st.Kind, st.Hinted, st.Opened, st.ProbeOwner, st.ProbeUntil = fs.Failures, fs.Until, fs.Kind, fs.Hinted, fs.Opened, fs.ProbeOwner, fs.ProbeUntil
	return encodeShared(&st), nil
}

// NewerFormatState is a state written by a later version of the package.
func NewerFormatState() []byte {
	return []byte(`{"v":` + strconv.Itoa(sharedFormat+1) + `}`)
}

// Freshen brings b's view up to its store's newest notice, as a pool's
// choice does from another goroutine than the sync's.
func Freshen(b *Breaker) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.freshen(time.Now())
}

// ReadStanding reads b's standing, as a pool's choice does.
func ReadStanding(b *Breaker) {
	b.standing(time.Now(), cost{})
}
