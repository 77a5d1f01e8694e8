package consumer

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
)

// stagePrefix starts the name of every staging table of group's consumers;
// stageName(group, member) is the one of the group member member. Named
// after the member so that a table whose member is no longer in the group
// (a consumer killed, whose Run never dropped it) can be told apart from
// one in use, and dropped (sweepStages). Only digits are joined into the
// name.
func stagePrefix(group string) string {
	return "decisions_stage_" + strconv.FormatUint(hash64(group), 10) + "_"
}

func stageName(group, member string) string {
	return stagePrefix(group) + strconv.FormatUint(hash64(member), 10)
}

func hash64(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// useStage names the staging table after the member this consumer is now
// (a lost session rejoins as another), dropping the one it used before.
// Callers hold mu.
func (c *Consumer) useStage(ctx context.Context) {
	member, _ := c.cl.GroupMetadata()
	name := stageName(c.cfg.Group, member)
	if name == c.stage {
		return
	}
	if c.stage == "" {
		c.stage = name
		return
	}
	if err := c.ch.Exec(ctx, c.stageSQL(qDropStage)); err != nil {
		c.log.Warn("drop staging table", "table", c.stage, "error", err)
	}
	c.stage = name
}

// sweepStages drops the staging tables of the group's consumers that are no
// longer members of it: killed ones, whose Run never dropped its table (a
// fleet of restarts left a table per restart). The tables are listed
// before the group is described, and only a Stable group's members are
// trusted to be all of them: a table listed was made by a member that had
// joined by then, so if it is live it is among them. Another group's
// tables are left alone. A member dropped by mistake (its session lost
// mid-batch, when its partitions are another's anyway) fails its batch,
// which is aborted and written again, never counted twice.
func (c *Consumer) sweepStages(ctx context.Context, adm *kadm.Client) (dropped int, err error) {
	prefix := stagePrefix(c.cfg.Group)
	var names []string
	err = eachRow(ctx, c.ch, "list staging tables", qStageTables, nil, func(rows driver.Rows) error {
		var name string
		if err := rows.Scan(&name); err != nil {
			return err
		}
		if rest, ok := strings.CutPrefix(name, prefix); ok {
			if _, err := strconv.ParseUint(rest, 10, 64); err == nil {
				names = append(names, name)
			}
		}
		return nil
	})
	if err != nil || len(names) == 0 {
		return 0, err
	}
	groups, err := adm.DescribeGroups(ctx, c.cfg.Group)
	if err != nil {
		return 0, fmt.Errorf("describe group: %w", err)
	}
	g, ok := groups[c.cfg.Group]
	if !ok || g.Err != nil {
		return 0, fmt.Errorf("describe group: %v", g.Err)
	}
	if g.State != "Stable" {
		return 0, nil // members joining or leaving: the next assignment sweeps
	}
	live := map[string]bool{}
	for _, m := range g.Members {
		live[stageName(c.cfg.Group, m.MemberID)] = true
	}
	for _, name := range names {
		if live[name] {
			continue
		}
		if err := c.ch.Exec(ctx, strings.ReplaceAll(qDropStage, "{stage}", name)); err != nil {
			return dropped, fmt.Errorf("drop staging table %s: %w", name, err)
		}
		dropped++
	}
	return dropped, nil
}
