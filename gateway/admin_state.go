package gateway

import (
	"time"

	"github.com/edgelimit/edgelimit/limiter"
)

// keyState and ruleState mirror limiter.KeyState and limiter.RuleState
// (limiter/inspect.go, branch onekey) until that lands; then they become
// aliases of them.
type keyState struct {
	Key   string
	Rules []ruleState
	TTL   time.Duration
}

type ruleState struct {
	Rule            string
	Algorithm       limiter.Algorithm
	Found           bool
	Remaining       int64
	Count, Previous int64
	ResetAfter      time.Duration
}
