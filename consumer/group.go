package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// commit commits the stored offsets of the given partitions (nil: all).
// Callers hold mu.
func (c *Consumer) commit(ctx context.Context, only []int32) error {
	offsets := map[int32]kgo.EpochOffset{}
	for id, p := range c.parts {
		if p.hasStored && (only == nil || contains(only, id)) {
			offsets[id] = p.stored
		}
	}
	if len(offsets) == 0 {
		return nil
	}
	var cerr error
	c.cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{c.cfg.Topic: offsets},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				cerr = err
				return
			}
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
						cerr = fmt.Errorf("partition %d: %w", p.Partition, err)
						return
					}
				}
			}
		})
	if cerr != nil {
		return cerr
	}
	for id, o := range offsets {
		if p := c.parts[id]; p != nil && p.stored == o {
			p.hasStored = false
		}
	}
	return nil
}

func contains(s []int32, v int32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// revoked runs when partitions move to another consumer (or on leaving the
// group): it waits for an insert in flight, commits what was stored, and
// forgets the rest, which the next owner reads again from ClickHouse's
// highest offset.
func (c *Consumer) revoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.InsertTimeout)
	defer cancel()
	ids := revoked[c.cfg.Topic]
	if err := c.commit(ctx, ids); err != nil {
		c.m.retries.WithLabelValues(stageCommit).Inc()
		c.log.Warn("commit on revoke", "error", err)
	}
	c.forget(ids)
}

// lost runs when the group session expired: the partitions may already be
// someone else's, so nothing is committed.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forget(lost[c.cfg.Topic])
}

func (c *Consumer) forget(ids []int32) {
	for _, id := range ids {
		if p := c.parts[id]; p != nil {
			c.pending -= len(p.rows) + len(p.dead)
			if p.blocked {
				c.m.blockedPartitions.Dec()
				// A pause outlives the assignment; its next owner here
				// must fetch.
				c.cl.ResumeFetchPartitions(map[string][]int32{c.cfg.Topic: {id}})
			}
			delete(c.parts, id)
		}
	}
}

// measureLag sets the lag gauge from the group's committed offsets every
// LagInterval.
func (c *Consumer) measureLag(ctx context.Context, adm *kadm.Client) {
	t := time.NewTicker(c.cfg.LagInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lctx, cancel := context.WithTimeout(ctx, c.cfg.LagInterval)
		lags, err := adm.Lag(lctx, c.cfg.Group)
		cancel()
		lag, ok := lags[c.cfg.Group]
		if err == nil && !ok {
			err = errors.New("group not described")
		} else if err == nil {
			err = lag.Error()
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// Counted, since the gauges now keep their last value: with
			// nothing fetched, committed or inserted while Kafka is out
			// of reach, this is the one failure that shows.
			c.m.retries.WithLabelValues(stageLag).Inc()
			c.log.Warn("measure lag", "group", c.cfg.Group, "error", err)
			continue
		}
		behind := lag.Lag.TotalByTopic()[c.cfg.Topic].Lag
		c.m.lag.Set(float64(behind))
		// Seconds behind: records wait past the high watermark while the
		// newest stored one is this old. Unlike a record count, it means
		// the same at 20 events/s and at 100k.
		secs := 0.0
		if behind > 0 {
			c.mu.Lock()
			since := c.storedAt
			if since.IsZero() {
				since = c.startedAt
			}
			c.mu.Unlock()
			secs = max(0, c.now().Sub(since).Seconds())
		}
		c.m.lagSeconds.Set(secs)
	}
}

// dropExpired applies retention by dropping day partitions, on servers
// without TTL.
func (c *Consumer) dropExpired(ctx context.Context) {
	ttl, err := SupportsTTL(c.ch)
	if err != nil {
		c.log.Warn("retention disabled: cannot read the server version", "error", err)
		return
	}
	if ttl {
		return // Migrate set TTLs
	}
	t := time.NewTicker(c.cfg.RetentionInterval)
	defer t.Stop()
	for {
		dropped, err := DropExpired(ctx, c.ch, c.cfg.Retention, c.now())
		if err != nil && ctx.Err() == nil {
			c.log.Warn("drop expired partitions", "error", err)
		}
		c.m.partitionsDropped.Add(float64(len(dropped)))
		if len(dropped) > 0 {
			c.log.Info("dropped expired partitions", "partitions", dropped)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
