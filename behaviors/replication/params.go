package replication

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// Limits of the params.
const (
	// MaxBatchSize caps Params.BatchSize.
	MaxBatchSize = 100_000
	// maxIdentifier is PostgreSQL's identifier length (NAMEDATALEN - 1).
	maxIdentifier = 63
	// maxDefinitionName caps a definition's name.
	maxDefinitionName = 200
)

// Params define a replication: copy the rows of the source table into the
// target table, upserting by primary key, in the order of the change column.
// They are checked when the JSON is decoded, so a malformed definition is
// refused by Submit (an *api.InvalidError) before anything is stored; Check
// also inspects the source and target catalogs.
type Params struct {
	// Source is the table rows are read from. Required.
	Source Endpoint `json:"source"`
	// Target is the table rows are written to. Required. It must have a
	// primary key (or a unique index on KeyColumns) and every column of
	// the key and the change column; columns it lacks are not copied.
	Target Endpoint `json:"target"`
	// ChangeColumn is a bigint column of the source that grows with every
	// insert and update (InstallChangeTrigger maintains it from a sequence).
	// The target keeps it too: a row is only overwritten by a newer one.
	// Required.
	ChangeColumn string `json:"change_column"`
	// KeyColumns are the columns rows are matched by. Empty: the target's
	// primary key, read from the catalog.
	KeyColumns []string `json:"key_columns,omitempty"`
	// Filter, when set, copies only the source rows whose column equals
	// the value (compared in the column's type).
	Filter *Filter `json:"filter,omitempty"`
	// TombstoneColumn, when set, names a source column that marks deleted
	// rows: true (boolean) or not null (any other type). Such rows are
	// deleted from the target instead of copied. Rows deleted from the
	// source outright are not: deletes are out of scope without a
	// tombstone.
	TombstoneColumn string `json:"tombstone_column,omitempty"`
	// Owner names who asked for the replication. It is part of the task
	// id, not of the replication id: two owners replicating the same rows
	// collide.
	Owner string `json:"owner,omitempty"`
	// BatchSize is how many rows one batch reads and writes. Zero: the
	// behavior's default (1,000).
	BatchSize int `json:"batch_size,omitempty"`
	// Definition is the name of the persistent definition the task runs;
	// empty for a transient replication. Set by Define.
	Definition string `json:"definition,omitempty"`
}

// Endpoint is a table in a PostgreSQL database.
type Endpoint struct {
	// DSN is the database's connection string (URL or key=value). It is
	// stored in the task's params as given, password included, for the
	// runs; the ids, the monitoring output and every reader of the task
	// (by its stint tag, see spi.RedactDSN) see it without the password.
	DSN string `json:"dsn" stint:"dsn"`
	// Table is the table's name, optionally schema-qualified
	// ("schema.table"). Names are used as written (quoted), so they are
	// case-sensitive.
	Table string `json:"table"`
}

// Filter selects the source rows whose Column equals Value.
type Filter struct {
	Column string `json:"column"`
	// Value is compared in the column's type, e.g. "42" for an integer
	// column.
	Value string `json:"value"`
}

// UnmarshalJSON decodes the params strictly (unknown fields are errors) and
// checks them (see Params.Validate).
func (p *Params) UnmarshalJSON(b []byte) error {
	type plain Params
	var v plain
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	*p = Params(v)
	return p.check()
}

// Validate checks the params without connecting anywhere: both endpoints
// have a parseable DSN and a table name, the column names are well formed,
// the batch size is in range. It returns an *api.InvalidError naming the
// field.
func (p Params) Validate() error {
	if err := p.check(); err != nil {
		var ie *api.InvalidError
		if errors.As(err, &ie) {
			return err
		}
		return api.Invalid("params", "%v", err)
	}
	return nil
}

// check is Validate with errors naming the field in their message, for
// UnmarshalJSON (the engine wraps them as invalid params).
func (p Params) check() error {
	for _, e := range []struct {
		name string
		ep   Endpoint
	}{{"source", p.Source}, {"target", p.Target}} {
		if strings.TrimSpace(e.ep.DSN) == "" {
			return api.Invalid("params."+e.name+".dsn", "required")
		}
		if _, err := pgconn.ParseConfig(e.ep.DSN); err != nil {
			return api.Invalid("params."+e.name+".dsn", "not a PostgreSQL connection string: %s", redactError(err, e.ep.DSN))
		}
		if _, err := parseTable(e.ep.Table); err != nil {
			return api.Invalid("params."+e.name+".table", "%v", err)
		}
	}
	if err := checkColumn(p.ChangeColumn); err != nil {
		return api.Invalid("params.change_column", "%v", err)
	}
	seen := map[string]bool{}
	for i, k := range p.KeyColumns {
		if err := checkColumn(k); err != nil {
			return api.Invalid(fmt.Sprintf("params.key_columns[%d]", i), "%v", err)
		}
		if seen[k] {
			return api.Invalid(fmt.Sprintf("params.key_columns[%d]", i), "%q is listed twice", k)
		}
		seen[k] = true
	}
	if seen[p.ChangeColumn] {
		return api.Invalid("params.key_columns", "the change column %q cannot be part of the key", p.ChangeColumn)
	}
	if p.Filter != nil {
		if err := checkColumn(p.Filter.Column); err != nil {
			return api.Invalid("params.filter.column", "%v", err)
		}
	}
	if p.TombstoneColumn != "" {
		if err := checkColumn(p.TombstoneColumn); err != nil {
			return api.Invalid("params.tombstone_column", "%v", err)
		}
	}
	if p.BatchSize < 0 || p.BatchSize > MaxBatchSize {
		return api.Invalid("params.batch_size", "%d is outside 0..%d", p.BatchSize, MaxBatchSize)
	}
	if len(p.Owner) > 256 {
		return api.Invalid("params.owner", "longer than 256 bytes")
	}
	if p.Definition != "" {
		if err := checkDefinitionName(p.Definition); err != nil {
			return api.Invalid("params.definition", "%v", err)
		}
	}
	return nil
}

// checkColumn checks a column name: 1 to 63 bytes, no NUL.
func checkColumn(name string) error {
	switch {
	case name == "":
		return errors.New("required")
	case len(name) > maxIdentifier:
		return fmt.Errorf("%q is longer than %d bytes", name[:20]+"...", maxIdentifier)
	case strings.ContainsRune(name, 0):
		return errors.New("contains a NUL byte")
	}
	return nil
}

// checkDefinitionName checks the name of a persistent definition.
func checkDefinitionName(name string) error {
	switch {
	case strings.TrimSpace(name) == "":
		return errors.New("required")
	case len(name) > maxDefinitionName:
		return fmt.Errorf("longer than %d bytes", maxDefinitionName)
	case strings.ContainsAny(name, "\x00\n\r\t"):
		return errors.New("contains a control character")
	}
	return nil
}

// parseTable splits "table" or "schema.table" into an identifier.
func parseTable(s string) (pgx.Identifier, error) {
	if s == "" {
		return nil, errors.New("required")
	}
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%q: want table or schema.table", s)
	}
	for _, part := range parts {
		if err := checkColumn(part); err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
	}
	return pgx.Identifier(parts), nil
}

// identity names the database a DSN connects to without its password:
// user@host:port/database. Equal identities are the same database.
func identity(dsn string) (string, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "", fmt.Errorf("parse connection string: %s", redactError(err, dsn))
	}
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database), nil
}

// mustIdentity is identity for params that were validated; a DSN that no
// longer parses falls back to its text, so that ids stay deterministic.
func mustIdentity(dsn string) string {
	id, err := identity(dsn)
	if err != nil {
		return dsn
	}
	return id
}

// redactError returns err's message with any password of dsn blanked.
func redactError(err error, dsn string) string {
	msg := err.Error()
	if cfg, perr := pgconn.ParseConfig(dsn); perr == nil && cfg.Password != "" {
		msg = strings.ReplaceAll(msg, cfg.Password, "xxxxx")
	}
	return strings.ReplaceAll(msg, dsn, spi.RedactDSN(dsn))
}

// jobParts are what a task id is derived from (the couch job_id): source,
// target, filter and owner.
func (p Params) jobParts() []any {
	filter := "-"
	if p.Filter != nil {
		filter = p.Filter.Column + "=" + p.Filter.Value
	}
	return []any{mustIdentity(p.Source.DSN), p.Source.Table, mustIdentity(p.Target.DSN), p.Target.Table, filter, p.Owner}
}

// TaskID returns the id of the task that runs p: deterministic from the
// source, the target, the filter and the owner (and whether it is
// continuous), so that submitting one replication twice makes one task.
func TaskID(p Params, continuous bool) api.TaskID {
	return spi.NewIDs(KindFor(continuous).ID).Deterministic(p.jobParts()...)
}

// ReplicationID returns the hash of everything that could change the result
// of p, as the CouchDB replicator's replication id does: the source and
// target databases and tables, the change,
// key, filter and tombstone columns and whether it is continuous; not the
// owner, the batch size or the definition name. keys are the key columns
// in effect (the target's primary key when p names none). Two replications
// with equal ids collide: only one runs at a time.
func ReplicationID(p Params, keys []string, continuous bool) string {
	h := sha256.New()
	filter := "-"
	if p.Filter != nil {
		filter = p.Filter.Column + "=" + p.Filter.Value
	}
	for _, part := range []string{"stint.replication.v1",
		mustIdentity(p.Source.DSN), p.Source.Table, p.ChangeColumn, filter,
		mustIdentity(p.Target.DSN), p.Target.Table, strings.Join(keys, ","), p.TombstoneColumn,
		fmt.Sprint(continuous)} {
		fmt.Fprintf(h, "%d:%s\x00", len(part), part)
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}
