package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

func TestZZDebug(t *testing.T) {
	rdb := mustRedis(t)
	co, _ := strconv.Atoi(os.Getenv("CO"))
	l := mustLimiter(t, rdb, Config{DenyCache: -1, Coalesce: co})
	ctx := context.Background()
	base := []Rule{
		{Name: "a", Limit: 100000, Period: time.Second},
		{Name: "b", Limit: 1000000, Period: time.Minute},
		{Name: "c", Limit: 100000000, Period: time.Hour},
	}
	rdb.ConfigResetStat(ctx)
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Go(func() {
			for i := 0; i < 1000; i++ {
				k := rand.IntN(100000)
				rules := append([]Rule(nil), base...)
				rules[0].Bucket = fmt.Sprintf("e%032x", k)
				rules[1].Bucket = fmt.Sprintf("e%032x", k+1<<20)
				rules[2].Bucket = fmt.Sprintf("e%032x", k%1000+1<<30)
				if _, err := l.Allow(ctx, "rls:bench", rules, 1); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Log(rdb.Info(ctx, "commandstats").Val())
}
