package impl_test

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// asRole creates a login role that is a member of role and returns the
// DSN of the test database as that login.
func (e *env) asRole(role string) string {
	e.t.Helper()
	login := fmt.Sprintf("%s_%d", role, time.Now().UnixNano())
	_, err := e.pool.Exec(e.ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN IN ROLE %s`, login, role))
	require.NoError(e.t, err)
	e.t.Cleanup(func() {
		_, _ = e.pool.Exec(e.ctx, fmt.Sprintf(`DROP OWNED BY %s; DROP ROLE %s`, login, login))
	})
	u, err := url.Parse(e.dsn)
	require.NoError(e.t, err)
	u.User = url.User(login)
	return u.String()
}

func TestClientRoleSubmitsButCannotClaimOrFinish(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.pool.Exec(e.ctx, `GRANT SELECT, INSERT, UPDATE ON test_run TO stint_node`)
	require.NoError(t, err)

	clientStore, err := postgres.Open(e.ctx, e.asRole("stint_client"))
	require.NoError(t, err)
	t.Cleanup(clientStore.Close)
	client, err := impl.NewClient(clientStore, impl.ClientConfig{Registry: testRegistry(e.pool, "c", time.Second), PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(client.Close)

	f, err := api.Submit(e.ctx, client, workKind, WorkParams{Key: "least"})
	require.NoError(t, err)
	_, err = client.Get(e.ctx, f.ID())
	require.NoError(t, err)

	_, err = clientStore.Claim(e.ctx, store.ClaimRequest{Node: "rogue", Limit: 1,
		Behaviors: []store.BehaviorLease{{Behavior: workKind.ID, Lease: time.Minute}}})
	require.ErrorContains(t, err, "permission denied")
	_, err = clientStore.Pool().Exec(e.ctx, `UPDATE stint_task SET lease = gen_random_uuid(), node = 'rogue'`)
	require.ErrorContains(t, err, "permission denied")

	// A node role runs it; the client's finish of the running task is
	// refused too.
	nodeStore, err := postgres.Open(e.ctx, e.asRole("stint_node"))
	require.NoError(t, err)
	t.Cleanup(nodeStore.Close)
	claimed, err := nodeStore.Claim(e.ctx, store.ClaimRequest{Node: "node", Limit: 1,
		Behaviors: []store.BehaviorLease{{Behavior: workKind.ID, Lease: time.Minute}}})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	_, err = clientStore.Finish(e.ctx, []store.Completion{{LeaseRef: claimed[0].LeaseRef, Status: api.StatusSuccess, Result: []byte(`{}`)}})
	require.ErrorContains(t, err, "permission denied")
	ok, err := nodeStore.Finish(e.ctx, []store.Completion{{LeaseRef: claimed[0].LeaseRef, Status: api.StatusSuccess, Result: []byte(`{"key":"least"}`)}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)
	res, err := f.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, "least", res.Key)
}
