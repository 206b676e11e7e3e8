package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
)

// Definition is a persistent replication: a row of the definitions table
// (stint_replication), whose task runs it.
type Definition struct {
	// Name identifies the definition. Required; 1 to 200 bytes.
	Name string `json:"name"`
	// Continuous makes the replication follow the source until it is
	// undefined; otherwise it runs once until caught up.
	Continuous bool `json:"continuous"`
	// Params define the replication. Params.Definition is set to Name.
	Params Params `json:"params"`
}

// StoredDefinition is a definition as stored, with what Define derived and
// the terminal state of its last run.
type StoredDefinition struct {
	Definition
	// TaskID is the task that runs the definition.
	TaskID api.TaskID `json:"task_id"`
	// ReplicationID is the definition's replication id.
	ReplicationID string `json:"replication_id"`
	// Version counts the definition's writes.
	Version int64 `json:"version"`
	// State is StateCompleted or StateFailed once its run ended that
	// way, empty while the replication is active.
	State State `json:"state,omitempty"`
	// StateDetail is the result (completed) or the error (failed).
	StateDetail json.RawMessage `json:"state_detail,omitempty"`
	StateAt     *time.Time      `json:"state_at,omitempty"`
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
}

// errNoDefinition is a definition that does not exist.
var errNoDefinition = errors.New("no such replication definition")

// ErrNoDefinition is returned by Undefine and GetDefinition for a name that
// is not defined.
var ErrNoDefinition = errNoDefinition

// CheckResult is what Check found out.
type CheckResult struct {
	// KeyColumns are the key columns in effect.
	KeyColumns []string `json:"key_columns"`
	// Columns are the columns the replication copies.
	Columns []string `json:"columns"`
	// ReplicationID is the replication's id.
	ReplicationID string `json:"replication_id"`
	// Warnings name things that work, but slowly.
	Warnings []string `json:"warnings,omitempty"`
}

// Check validates p (Params.Validate) and checks it against the source and
// target catalogs: both tables exist, the change column is a bigint in
// both, the key, filter and tombstone columns exist, the target has a
// primary key or a unique index on the key columns. A mismatch is an
// *api.InvalidError; a database that cannot be reached is another error.
func Check(ctx context.Context, p Params, continuous bool, connectTimeout time.Duration) (CheckResult, error) {
	if err := p.Validate(); err != nil {
		return CheckResult{}, err
	}
	if connectTimeout <= 0 {
		connectTimeout = 10 * time.Second
	}
	srcTable, _ := parseTable(p.Source.Table)
	dstTable, _ := parseTable(p.Target.Table)
	describe := func(ep Endpoint, table pgx.Identifier, what string) (*tableInfo, *pgx.Conn, error) {
		conn, err := connect(ctx, ep.DSN, "stint:check", connectTimeout)
		if err != nil {
			return nil, nil, fmt.Errorf("check replication: %s: %w", what, err)
		}
		info, err := describeTable(ctx, conn, table, p.ChangeColumn)
		if err != nil {
			conn.Close(context.WithoutCancel(ctx))
			if errIsSchema(err) {
				return nil, nil, api.Invalid("params."+what+".table", "%v", err)
			}
			return nil, nil, fmt.Errorf("check replication: %s: %w", what, err)
		}
		return info, conn, nil
	}
	src, srcConn, err := describe(p.Source, srcTable, "source")
	if err != nil {
		return CheckResult{}, err
	}
	defer srcConn.Close(context.WithoutCancel(ctx))
	dst, dstConn, err := describe(p.Target, dstTable, "target")
	if err != nil {
		return CheckResult{}, err
	}
	dstConn.Close(context.WithoutCancel(ctx))
	pl, err := makePlan(p, src, dst)
	if err != nil {
		return CheckResult{}, api.Invalid("params", "%v", err)
	}
	if err := (&source{conn: srcConn, plan: pl}).prepare(ctx); err != nil {
		return CheckResult{}, api.Invalid("params.filter.value", "%v", err)
	}
	if err := checkNulls(ctx, srcConn, pl); err != nil {
		return CheckResult{}, fmt.Errorf("check replication: source: %w", err)
	}
	return CheckResult{KeyColumns: pl.keys, Columns: pl.columns, ReplicationID: ReplicationID(p, pl.keys, continuous),
		Warnings: pl.warnings}, nil
}

// TxSubmitter is the task API with a submit in the caller's transaction,
// as Define needs it: an *impl.Client or *impl.Server has it.
type TxSubmitter interface {
	api.Tasks
	// SubmitTx submits a task in tx: it exists if and only if tx commits.
	SubmitTx(ctx context.Context, tx pgx.Tx, req api.SubmitRequest) (api.Submission, error)
}

// Define writes a persistent replication and submits its task in one
// transaction, after checking it (Check): an invalid definition is refused
// with an *api.InvalidError, and a definition whose task cannot be
// submitted with the submit's error; either way nothing is written. db is
// the stint database, the one tasks stores its tasks in. Defining an
// existing name updates it: a running task restarts with the new
// definition at its next checkpoint, a waiting or finished one runs again
// with it; if the update changes the task id (another source, target,
// filter, owner or mode), the old task is removed after the commit (should
// that fail, a server's start removes it: Reconcile). Two names may not
// define the same task.
func Define(ctx context.Context, db *pgxpool.Pool, tasks TxSubmitter, d Definition) (api.TaskID, error) {
	if err := checkDefinitionName(d.Name); err != nil {
		return "", api.Invalid("name", "%v", err)
	}
	p := d.Params
	p.Definition = d.Name
	chk, err := Check(ctx, p, d.Continuous, 0)
	if err != nil {
		return "", err
	}
	id := TaskID(p, d.Continuous)
	raw, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("define replication %q: encode params: %w", d.Name, err)
	}
	var old string
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var other string
		err := tx.QueryRow(ctx, `SELECT name FROM stint_replication WHERE task_id = $1 AND name <> $2`, string(id), d.Name).Scan(&other)
		if err == nil {
			return api.Invalid("params", "definition %q already defines this replication (task %s)", other, id)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		err = tx.QueryRow(ctx, `SELECT task_id FROM stint_replication WHERE name = $1 FOR UPDATE`, d.Name).Scan(&old)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		_, err = tx.Exec(ctx, `
			INSERT INTO stint_replication (name, owner, continuous, params, task_id, replication_id)
			VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (name) DO UPDATE SET owner = $2, continuous = $3, params = $4, task_id = $5,
			    replication_id = $6, version = stint_replication.version + 1,
			    state = NULL, state_detail = NULL, state_at = NULL, updated_at = now()`,
			d.Name, p.Owner, d.Continuous, raw, string(id), chk.ReplicationID)
		if err != nil {
			return err
		}
		if _, err := tasks.SubmitTx(ctx, tx, api.SubmitRequest{Behavior: KindFor(d.Continuous).ID, Params: raw}); err != nil {
			return &submitError{err}
		}
		return nil
	})
	var se *submitError
	var ie *api.InvalidError
	switch {
	case errors.As(err, &se):
		return "", fmt.Errorf("define replication %q: submit its task: %w", d.Name, se.err)
	case errors.As(err, &ie):
		return "", err
	case err != nil:
		return "", fmt.Errorf("define replication %q: %w", d.Name, err)
	}
	if old != "" && old != string(id) {
		if err := tasks.Remove(ctx, api.TaskID(old)); err != nil && !errors.Is(err, api.ErrNotFound) {
			return "", fmt.Errorf("define replication %q: remove its old task %s: %w", d.Name, old, err)
		}
	}
	return id, nil
}

// submitError is the error of the submit of a definition's task.
type submitError struct{ err error }

func (e *submitError) Error() string { return e.err.Error() }
func (e *submitError) Unwrap() error { return e.err }

// Undefine deletes a persistent replication and removes its task (a
// running one halts at its next write). It returns ErrNoDefinition for a
// name that is not defined.
func Undefine(ctx context.Context, db *pgxpool.Pool, tasks api.Tasks, name string) error {
	var id string
	err := db.QueryRow(ctx, `DELETE FROM stint_replication WHERE name = $1 RETURNING task_id`, name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("undefine replication %q: %w", name, errNoDefinition)
	}
	if err != nil {
		return fmt.Errorf("undefine replication %q: %w", name, err)
	}
	if err := tasks.Remove(ctx, api.TaskID(id)); err != nil && !errors.Is(err, api.ErrNotFound) {
		return fmt.Errorf("undefine replication %q: remove its task %s: %w", name, id, err)
	}
	return nil
}

const definitionColumns = `name, continuous, params, task_id, replication_id, version, coalesce(state, ''),
	state_detail, state_at, created_at, updated_at`

func scanDefinition(row pgx.Row) (StoredDefinition, error) {
	var d StoredDefinition
	var params []byte
	var state string
	var detail []byte
	err := row.Scan(&d.Name, &d.Continuous, &params, &d.TaskID, &d.ReplicationID, &d.Version, &state,
		&detail, &d.StateAt, &d.CreatedAt, &d.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, errNoDefinition
	}
	if err != nil {
		return d, err
	}
	d.State, d.StateDetail = State(state), detail
	// Decode without the checks of UnmarshalJSON: a stored definition is
	// shown and run as it is.
	type plain Params
	if err := json.Unmarshal(params, (*plain)(&d.Params)); err != nil {
		return d, fmt.Errorf("decode definition %q: %w", d.Name, err)
	}
	return d, nil
}

// GetDefinition returns a persistent replication, or ErrNoDefinition.
func GetDefinition(ctx context.Context, db *pgxpool.Pool, name string) (StoredDefinition, error) {
	d, err := loadDefinition(ctx, db, name)
	if err != nil {
		return d, fmt.Errorf("get replication definition %q: %w", name, err)
	}
	return d, nil
}

func loadDefinition(ctx context.Context, db *pgxpool.Pool, name string) (StoredDefinition, error) {
	return scanDefinition(db.QueryRow(ctx, `SELECT `+definitionColumns+` FROM stint_replication WHERE name = $1`, name))
}

// Definitions lists the persistent replications by name.
func Definitions(ctx context.Context, db *pgxpool.Pool) ([]StoredDefinition, error) {
	rows, err := db.Query(ctx, `SELECT `+definitionColumns+` FROM stint_replication ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list replication definitions: %w", err)
	}
	defer rows.Close()
	var out []StoredDefinition
	for rows.Next() {
		d, err := scanDefinition(rows)
		if err != nil {
			return nil, fmt.Errorf("list replication definitions: %w", err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list replication definitions: %w", err)
	}
	return out, nil
}

// definitionVersion returns the version of a definition if task still runs
// it, or errNoDefinition.
func definitionVersion(ctx context.Context, db *pgxpool.Pool, name string, task api.TaskID) (int64, error) {
	var v int64
	err := db.QueryRow(ctx, `SELECT version FROM stint_replication WHERE name = $1 AND task_id = $2`, name, string(task)).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, errNoDefinition
	}
	if err != nil {
		return 0, fmt.Errorf("read the version of replication definition %q: %w", name, err)
	}
	return v, nil
}

// clearState marks a definition active again when its task runs.
func clearState(ctx context.Context, db *pgxpool.Pool, name string, task api.TaskID) error {
	_, err := db.Exec(ctx, `UPDATE stint_replication SET state = NULL, state_detail = NULL, state_at = NULL
		WHERE name = $1 AND task_id = $2 AND state IS NOT NULL`, name, string(task))
	if err != nil {
		return fmt.Errorf("mark replication definition %q active: %w", name, err)
	}
	return nil
}

// recordState records the terminal state of a definition's run.
func recordState(ctx context.Context, db *pgxpool.Pool, name string, task api.TaskID, state State, detail json.RawMessage) error {
	_, err := db.Exec(ctx, `UPDATE stint_replication SET state = $3, state_detail = $4, state_at = now()
		WHERE name = $1 AND task_id = $2`, name, string(task), string(state), string(detail))
	if err != nil {
		return fmt.Errorf("record state %s of replication definition %q: %w", state, name, err)
	}
	return nil
}

// ReconcileResult says what Reconcile did.
type ReconcileResult struct {
	// Submitted are the tasks submitted for active definitions that had
	// none.
	Submitted []api.TaskID `json:"submitted,omitempty"`
	// Removed are the tasks of persistent replications whose definition
	// is gone or now has another task.
	Removed []api.TaskID `json:"removed,omitempty"`
}

// Reconcile makes the tasks of persistent replications match the
// definitions table: an active definition (no terminal state) without a
// task gets one, and a persistent replication's task whose definition is
// gone, or now runs under another task id, is removed. Servers running a
// replication behavior with Config.DB do it when they start, which repairs
// a Define or Undefine interrupted between the table and the task.
func Reconcile(ctx context.Context, db *pgxpool.Pool, tasks api.Tasks) (ReconcileResult, error) {
	var res ReconcileResult
	for _, continuous := range []bool{false, true} {
		r, err := reconcile(ctx, db, tasks, continuous)
		res.Submitted = append(res.Submitted, r.Submitted...)
		res.Removed = append(res.Removed, r.Removed...)
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// reconcile is Reconcile for one of the two behaviors.
func reconcile(ctx context.Context, db *pgxpool.Pool, tasks api.Tasks, continuous bool) (ReconcileResult, error) {
	var res ReconcileResult
	defs, err := Definitions(ctx, db)
	if err != nil {
		return res, err
	}
	byName := map[string]StoredDefinition{}
	for _, d := range defs {
		if d.Continuous != continuous {
			continue
		}
		byName[d.Name] = d
		if d.State != "" {
			continue
		}
		if _, err := tasks.Get(ctx, d.TaskID); !errors.Is(err, api.ErrNotFound) {
			if err != nil {
				return res, fmt.Errorf("reconcile replication definitions: %w", err)
			}
			continue
		}
		p := d.Params
		p.Definition = d.Name
		raw, err := json.Marshal(p)
		if err != nil {
			return res, fmt.Errorf("reconcile replication definitions: %w", err)
		}
		if _, err := tasks.Submit(ctx, api.SubmitRequest{Behavior: KindFor(continuous).ID, Params: raw}); err != nil {
			return res, fmt.Errorf("reconcile replication definitions: submit the task of %q: %w", d.Name, err)
		}
		res.Submitted = append(res.Submitted, d.TaskID)
	}
	f := api.Filter{Behavior: KindFor(continuous).ID, Limit: 1000}
	for {
		page, err := tasks.List(ctx, f)
		if err != nil {
			return res, fmt.Errorf("reconcile replication definitions: %w", err)
		}
		for _, t := range page.Tasks {
			var p struct {
				Definition string `json:"definition"`
			}
			if json.Unmarshal(t.Params, &p) != nil || p.Definition == "" {
				continue
			}
			if d, ok := byName[p.Definition]; ok && d.TaskID == t.ID {
				continue
			}
			// Read the definition again: a Define since the list above
			// may have written it.
			d, err := loadDefinition(ctx, db, p.Definition)
			if err == nil && d.TaskID == t.ID {
				continue
			}
			if err != nil && !errors.Is(err, errNoDefinition) {
				return res, fmt.Errorf("reconcile replication definitions: %w", err)
			}
			if err := tasks.Remove(ctx, t.ID); err != nil && !errors.Is(err, api.ErrNotFound) {
				return res, fmt.Errorf("reconcile replication definitions: remove task %s: %w", t.ID, err)
			}
			res.Removed = append(res.Removed, t.ID)
		}
		if page.Next == "" {
			return res, nil
		}
		f.After = page.Next
	}
}
