package event

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckTopic(t *testing.T) {
	for _, name := range []string{"decisions", "decisions-dead-letter", "a.b_c-D9", strings.Repeat("x", 249)} {
		if err := CheckTopic(name); err != nil {
			t.Errorf("CheckTopic(%q) = %v, want nil", name, err)
		}
	}
	for _, name := range []string{"", ".", "..", "my topic", "decisions\n", "décisions", "a/b", "a:b", strings.Repeat("x", 250)} {
		if err := CheckTopic(name); !errors.Is(err, ErrTopicName) {
			t.Errorf("CheckTopic(%q) = %v, want ErrTopicName", name, err)
		}
	}
}
