package consumer

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// committed returns the group's committed offsets for topic by partition.
func committed(t testing.TB, brokers []string, group, topic string) map[int32]int64 {
	t.Helper()
	ctx, adm, done := testenv.KafkaAdmin(t, brokers, 30*time.Second)
	defer done()
	resp, err := adm.FetchOffsets(ctx, group)
	// A broker just started elects the group coordinator first.
	for kerr.IsRetriable(err) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		resp, err = adm.FetchOffsets(ctx, group)
	}
	if err != nil {
		t.Fatalf("fetch offsets of %s: %v", group, err)
	}
	out := map[int32]int64{}
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil {
			out[o.Partition] = o.At
		}
	})
	return out
}
