package consumer

import (
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgelimit/edgelimit/gateway/event"
)

// columns holds decoded rows column by column, in the order of
// query/insert_decisions.sql, ready for the driver's columnar append.
type columns struct {
	eventID       []string
	time          []time.Time
	timeMS        []uint16
	gatewayID     []string
	keyID         []string
	keyKind       []string
	clientIP      []string
	userAgentHash []uint64
	route         []string
	method        []string
	plan          []string
	bindingRule   []string
	allowed       []uint8
	ruleLimit     []int64
	remaining     []int64
	cost          []int64
	storeStatus   []string
	mode          []string
	latencyUS     []uint32
	version       []uint8
	topic         []string
	partition     []int32
	offset        []int64

	minTime, maxTime time.Time
}

func (c *columns) len() int { return len(c.offset) }

func (c *columns) add(d *event.Decision, topic string, partition int32, offset int64) {
	t := d.Time
	c.eventID = append(c.eventID, string(d.ID[:]))
	c.time = append(c.time, t)
	c.timeMS = append(c.timeMS, uint16(t.Nanosecond()/int(time.Millisecond)))
	c.gatewayID = append(c.gatewayID, d.GatewayID)
	c.keyID = append(c.keyID, d.KeyID)
	c.keyKind = append(c.keyKind, d.KeyKind.String())
	c.clientIP = append(c.clientIP, d.ClientIP)
	c.userAgentHash = append(c.userAgentHash, d.UserAgentHash)
	c.route = append(c.route, d.Route)
	c.method = append(c.method, d.Method)
	c.plan = append(c.plan, d.Plan)
	c.bindingRule = append(c.bindingRule, d.BindingRule)
	c.allowed = append(c.allowed, b2u(d.Allowed))
	c.ruleLimit = append(c.ruleLimit, d.Limit)
	c.remaining = append(c.remaining, d.Remaining)
	c.cost = append(c.cost, d.Cost)
	c.storeStatus = append(c.storeStatus, d.StoreStatus.String())
	c.mode = append(c.mode, d.Mode.String())
	c.latencyUS = append(c.latencyUS, latencyMicros(d.CheckLatency))
	c.version = append(c.version, event.Version)
	c.topic = append(c.topic, topic)
	c.partition = append(c.partition, partition)
	c.offset = append(c.offset, offset)
	if c.len() == 1 || t.Before(c.minTime) {
		c.minTime = t
	}
	if c.len() == 1 || t.After(c.maxTime) {
		c.maxTime = t
	}
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// latencyMicros clamps a check latency into the UInt32 microseconds column.
func latencyMicros(d time.Duration) uint32 {
	us := d.Microseconds()
	switch {
	case us < 0:
		return 0
	case us > 1<<32-1:
		return 1<<32 - 1
	}
	return uint32(us)
}

// slices returns the columns in insert order.
func (c *columns) slices() []any {
	return []any{
		c.eventID, c.time, c.timeMS, c.gatewayID, c.keyID, c.keyKind, c.clientIP,
		c.userAgentHash, c.route, c.method, c.plan, c.bindingRule, c.allowed, c.ruleLimit,
		c.remaining, c.cost, c.storeStatus, c.mode, c.latencyUS, c.version,
		c.topic, c.partition, c.offset,
	}
}

// appendTo adds the rows to a prepared INSERT.
func (c *columns) appendTo(b driver.Batch) error {
	for i, col := range c.slices() {
		if err := b.Column(i).Append(col); err != nil {
			return fmt.Errorf("append column %d: %w", i, err)
		}
	}
	return nil
}

// keep returns the columns holding only the rows for which keep(offset) is
// true.
func (c *columns) keep(keep func(offset int64) bool) columns {
	var out columns
	for i := range c.offset {
		if !keep(c.offset[i]) {
			continue
		}
		out.eventID = append(out.eventID, c.eventID[i])
		out.time = append(out.time, c.time[i])
		out.timeMS = append(out.timeMS, c.timeMS[i])
		out.gatewayID = append(out.gatewayID, c.gatewayID[i])
		out.keyID = append(out.keyID, c.keyID[i])
		out.keyKind = append(out.keyKind, c.keyKind[i])
		out.clientIP = append(out.clientIP, c.clientIP[i])
		out.userAgentHash = append(out.userAgentHash, c.userAgentHash[i])
		out.route = append(out.route, c.route[i])
		out.method = append(out.method, c.method[i])
		out.plan = append(out.plan, c.plan[i])
		out.bindingRule = append(out.bindingRule, c.bindingRule[i])
		out.allowed = append(out.allowed, c.allowed[i])
		out.ruleLimit = append(out.ruleLimit, c.ruleLimit[i])
		out.remaining = append(out.remaining, c.remaining[i])
		out.cost = append(out.cost, c.cost[i])
		out.storeStatus = append(out.storeStatus, c.storeStatus[i])
		out.mode = append(out.mode, c.mode[i])
		out.latencyUS = append(out.latencyUS, c.latencyUS[i])
		out.version = append(out.version, c.version[i])
		out.topic = append(out.topic, c.topic[i])
		out.partition = append(out.partition, c.partition[i])
		out.offset = append(out.offset, c.offset[i])
		if out.len() == 1 || c.time[i].Before(out.minTime) {
			out.minTime = c.time[i]
		}
		if out.len() == 1 || c.time[i].After(out.maxTime) {
			out.maxTime = c.time[i]
		}
	}
	return out
}
