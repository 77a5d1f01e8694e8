package event

import (
	"errors"
	"fmt"
)

// ErrTopicName means a name is not one Kafka accepts for a topic.
var ErrTopicName = errors.New("event: not a Kafka topic name")

// maxTopicLen is Kafka's own limit on a topic name.
const maxTopicLen = 249

// CheckTopic reports whether name is a topic name Kafka accepts: 1 to 249
// of a-z, A-Z, 0-9, '.', '_' and '-', and not "." or "..", the rule of
// Kafka's Topic.validate. Both ends of the pipeline check the topics they
// are configured with at start: the broker refuses any other name on every
// request, so a gateway would drop every event (counted, but only as
// broker errors) and a consumer retry forever, where a clear error at start
// is what the operator needs. The error repeats name quoted.
func CheckTopic(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("%w: %q", ErrTopicName, name)
	case len(name) > maxTopicLen:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrTopicName, len(name), maxTopicLen)
	}
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q (only a-z, A-Z, 0-9, '.', '_' and '-')", ErrTopicName, name)
		}
	}
	return nil
}
