package network

import (
	"fmt"
	"github.com/stinthq/stint/internal/chaos"
	mrand "math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/impl"
)

func TestProxyCutsAndDelays(t *testing.T) {
	tasks, faultFor := chaos.Size()
	chaos.Scenario(t, tasks, faultFor, func(c *chaos.Cluster, stop <-chan struct{}) {
		u, err := url.Parse(c.DSN)
		require.NoError(t, err)
		p, err := chaos.NewProxy(u.Host)
		require.NoError(t, err)
		defer p.Close()
		// Move node 0 behind the proxy.
		n := c.Nodes[0]
		c.Sigkill(n)
		u.Host = p.Addr()
		n.DSN = u.String()
		c.Start(n)
		chaos.Every(stop, 400*time.Millisecond, 400*time.Millisecond, func() {
			switch mrand.IntN(3) {
			case 0:
				p.Cut()
			case 1:
				p.Delay.Store(int64(30 * time.Millisecond))
			default:
				p.Delay.Store(0)
			}
		})
		p.Delay.Store(0)
	})
}

func TestSilentNetworkLoss(t *testing.T) {
	c := chaos.NewCluster(t)
	// What the README asks of the server for silent losses: the backend
	// of a client that vanished in a transaction would hold its locks
	// until the server's TCP keepalive gives up (never, on this
	// loopback: the proxy's end answers).
	_, err := c.Pool.Exec(c.Ctx, fmt.Sprintf(`ALTER DATABASE %s SET idle_in_transaction_session_timeout = '5s'`,
		pgx.Identifier{strings.TrimPrefix(chaos.MustURL(t, c.DSN).Path, "/")}.Sanitize()))
	require.NoError(t, err)
	p := c.BehindProxy() // every node: none can work during the loss
	c.StartAll()
	// Past every detection bound (10 s for the listener).
	c.Incident("silent network loss", chaos.IncidentFor(12*time.Second), func() {
		p.Blackhole()
		// Tasks submitted during the loss (the client is not behind the
		// proxy) start once the path is back.
		c.Extra = c.SubmitFrom(1_000_000, 20)
	}, func() {
		p.Restore(true) // the connections of before stay dead, never closed
	}, impl.CauseListener, impl.CauseUnreachable) // the listener's dead connection: only its own check finds it out
}
