package testenv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/bufbuild/protocompile"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// WaitFor polls cond until it holds, and fails the test if it does not
// within timeout: the way tests await a condition instead of sleeping for
// a guessed time. It polls every 10ms at first, backing off to 250ms so a
// long wait on a server does not flood it.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for every := 10 * time.Millisecond; !cond(); every = min(2*every, 250*time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(every)
	}
}

// KafkaAdmin is an admin client of brokers and a context for its calls that
// ends after timeout; done cancels the one and closes the other.
func KafkaAdmin(tb testing.TB, brokers []string, timeout time.Duration) (ctx context.Context, adm *kadm.Client, done func()) {
	tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	return ctx, kadm.NewClient(cl), func() { cancel(); cl.Close() }
}

// CreateTopics creates topics with partitions each (replication 1) on
// brokers.
func CreateTopics(tb testing.TB, brokers []string, partitions int32, topics ...string) {
	tb.Helper()
	ctx, adm, done := KafkaAdmin(tb, brokers, 30*time.Second)
	defer done()
	resp, err := adm.CreateTopics(ctx, partitions, 1, nil, topics...)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		tb.Fatalf("create topics %v: %v", topics, err)
	}
}

// Consume reads n records from the start of topic on brokers, failing the
// test after 30s or at a fetch error.
func Consume(tb testing.TB, brokers []string, topic string, n int) []*kgo.Record {
	tb.Helper()
	return ConsumeWhere(tb, brokers, topic, n, nil)
}

// ConsumeWhere is Consume counting only the records keep keeps (nil: all),
// and returning only those.
func ConsumeWhere(tb testing.TB, brokers []string, topic string, n int, keep func(*kgo.Record) bool) []*kgo.Record {
	tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		tb.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			tb.Fatalf("consumed %d of %d records from %s: %v", len(recs), n, topic, err)
		}
		fs.EachError(func(topic string, p int32, err error) { tb.Fatalf("fetch %s/%d: %v", topic, p, err) })
		for _, r := range fs.Records() {
			if keep == nil || keep(r) {
				recs = append(recs, r)
			}
		}
	}
	return recs
}

// OpenClickHouse connects to the database db of the ClickHouse server at
// addr over the native protocol, closed when the test ends.
func OpenClickHouse(tb testing.TB, addr, db string) driver.Conn {
	tb.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{addr},
		Protocol:    clickhouse.Native,
		Auth:        clickhouse.Auth{Database: db, Username: "default"},
		DialTimeout: 2 * time.Second,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return conn
}

// NewDatabase creates a database of the test's own, named prefix and a
// unique suffix, on the ClickHouse server at addr, and returns a connection
// to it and its name. It is dropped when the test ends, unless
// EDGELIMIT_KEEP_TEST_DB is set, so a failed test's rows can be read.
func NewDatabase(tb testing.TB, addr, prefix string) (driver.Conn, string) {
	tb.Helper()
	db := fmt.Sprintf("%s_%d_%d", prefix, time.Now().UnixNano(), rand.IntN(1000))
	root := OpenClickHouse(tb, addr, "default")
	if err := root.Exec(context.Background(), "CREATE DATABASE IF NOT EXISTS "+db); err != nil {
		tb.Fatalf("create database: %v", err)
	}
	tb.Cleanup(func() {
		if os.Getenv("EDGELIMIT_KEEP_TEST_DB") != "" {
			tb.Logf("kept database %s", db)
			return
		}
		if err := root.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db); err != nil {
			tb.Logf("drop database %s: %v", db, err)
		}
	})
	return OpenClickHouse(tb, addr, db), db
}

// ClusterShards creates the databases dbs on each shard of srv, the
// private two-shard "clickhouse-cluster", and returns a connection per
// shard to the first of them: the local tables a Distributed table spreads
// over.
func ClusterShards(tb testing.TB, srv *Server, dbs ...string) []driver.Conn {
	tb.Helper()
	var shards []driver.Conn
	for _, name := range []string{"EDGELIMIT_CLICKHOUSE_SHARD1", "EDGELIMIT_CLICKHOUSE_SHARD2"} {
		addr := srv.Get(tb, name)
		root := OpenClickHouse(tb, addr, "default")
		for _, db := range dbs {
			if err := root.Exec(context.Background(), "CREATE DATABASE IF NOT EXISTS "+db); err != nil {
				tb.Fatalf("create database %s on %s: %v", db, name, err)
			}
		}
		shards = append(shards, OpenClickHouse(tb, addr, dbs[0]))
	}
	return shards
}

// Distributed starts a private two-shard "clickhouse-cluster", migrates a
// database of the test's own on each shard with migrate (the local tables),
// and has distribute make, in a second database on the first shard, the
// Distributed tables in front of them (the product's own code, e.g.
// consumer.CreateDistributed). It returns the server, a connection per
// shard to its local database, and one to the Distributed tables.
func Distributed(tb testing.TB, migrate func(context.Context, driver.Conn) error,
	distribute func(ctx context.Context, conn driver.Conn, cluster, local string) error) (srv *Server, shards []driver.Conn, dist driver.Conn) {
	tb.Helper()
	srv = Private(tb, "clickhouse-cluster")
	cluster := srv.Get(tb, "EDGELIMIT_CLICKHOUSE_CLUSTER")
	ctx := context.Background()
	suffix := fmt.Sprint(time.Now().UnixNano())
	local, distDB := "local_"+suffix, "dist_"+suffix
	shards = ClusterShards(tb, srv, local, distDB)
	for i, c := range shards {
		if err := migrate(ctx, c); err != nil {
			tb.Fatalf("migrate shard %d: %v", i+1, err)
		}
	}
	dist = OpenClickHouse(tb, srv.Get(tb, "EDGELIMIT_CLICKHOUSE_SHARD1"), distDB)
	if err := distribute(ctx, dist, cluster, local); err != nil {
		tb.Fatalf("create Distributed tables: %v", err)
	}
	return srv, shards, dist
}

// ProtoMessage parses the .proto file in dir at test time, with no
// generated code, and returns its message name: how a test reads records
// the way any protobuf tool would, from the shipped contract alone.
func ProtoMessage(tb testing.TB, dir, file, name string) protoreflect.MessageDescriptor {
	tb.Helper()
	c := protocompile.Compiler{Resolver: &protocompile.SourceResolver{ImportPaths: []string{dir}}}
	files, err := c.Compile(context.Background(), file)
	if err != nil {
		tb.Fatalf("compile %s: %v", file, err)
	}
	md := files[0].Messages().ByName(protoreflect.Name(name))
	if md == nil {
		tb.Fatalf("%s has no message %s", file, name)
	}
	return md
}
