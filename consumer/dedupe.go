package consumer

// dedupeWindow is how many of the most recently stored event ids a
// consumer remembers, about 12 MB: an event repeated at a later offset
// (a producer's retry after an epoch bump, whose first attempt Kafka had
// written after all; a record produced again by hand or by a mirror) is
// stored once if its first copy is among them. At 100k events/s that is
// the last 2.6s of the whole topic; a producer's retry lands within its
// in-flight requests, a few batches behind the first copy. A newly
// assigned partition's share is read back from Kafka (partition.seedFrom),
// so a restart or a rebalance does not empty it.
const dedupeWindow = 1 << 18

// idWindow is a bounded set of event ids: the newest n added, the oldest
// forgotten first.
type idWindow struct {
	seen map[[16]byte]struct{}
	ring [][16]byte // in the order added; next is the oldest once full
	next int
}

func newIDWindow(n int) *idWindow {
	return &idWindow{seen: make(map[[16]byte]struct{}, n), ring: make([][16]byte, 0, n)}
}

func (w *idWindow) has(id [16]byte) bool {
	_, ok := w.seen[id]
	return ok
}

// add remembers id, which must not be there, forgetting the oldest when
// the window is full.
func (w *idWindow) add(id [16]byte) {
	if len(w.ring) < cap(w.ring) {
		w.ring = append(w.ring, id)
	} else {
		delete(w.seen, w.ring[w.next])
		w.ring[w.next] = id
		w.next = (w.next + 1) % len(w.ring)
	}
	w.seen[id] = struct{}{}
}

// dropDuplicates removes from the batch's rows each event stored already
// (in c.stored) or repeated within the batch, counting them, and returns
// how many rows are left. Callers hold mu.
func (c *Consumer) dropDuplicates(batch []*partition) int {
	total := 0
	for _, p := range batch {
		total += len(p.rows)
	}
	inBatch := make(map[[16]byte]struct{}, total)
	left := 0
	for _, p := range batch {
		n := 0
		for i := range p.rows {
			id := p.rows[i].d.ID
			if _, again := inBatch[id]; again || c.stored.has(id) {
				c.m.duplicates.Inc()
				c.pending--
				continue
			}
			inBatch[id] = struct{}{}
			if n != i {
				p.rows[n] = p.rows[i]
			}
			n++
		}
		clear(p.rows[n:]) // the dropped rows' strings
		p.rows = p.rows[:n]
		left += n
	}
	return left
}

// remember adds the ids of a batch just committed to c.stored. Callers
// hold mu.
func (c *Consumer) remember(batch []*partition) {
	for _, p := range batch {
		for i := range p.rows {
			c.stored.add(p.rows[i].d.ID)
		}
	}
}
