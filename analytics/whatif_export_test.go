package analytics

// WithChunkRows returns q cutting chunks of about n decisions, so tests
// can replay many chunks from a few rows.
func WithChunkRows(q WhatIfQuery, n int64) WhatIfQuery {
	q.chunkRows = n
	return q
}
