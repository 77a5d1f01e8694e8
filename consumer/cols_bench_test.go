package consumer

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/event"
)

// BenchmarkBatchColumns is the consumer's own work for one batch of 50,000
// records: check the header, decode, buffer the row, build every column.
func BenchmarkBatchColumns(b *testing.B) {
	ds := decisions(50_000)
	recs := make([]*kgo.Record, len(ds))
	for i, d := range ds {
		recs[i] = record(b, d)
		recs[i].Offset = int64(i)
	}
	var rows []row
	b.ReportAllocs()
	for b.Loop() {
		clear(rows)
		rows = rows[:0]
		var d event.Decision
		for _, r := range recs {
			if err := decode(&d, r); err != nil {
				b.Fatal(err)
			}
			rows = append(rows, row{d: d, topic: "decisions", offset: r.Offset})
		}
		for _, c := range decisionColumns {
			_ = c.values([][]row{rows}, len(rows))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/row")
}
