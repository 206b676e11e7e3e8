package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stinthq/stint/spi"
)

// column is a table column from the catalog.
type column struct {
	name      string
	typ       string // format_type, e.g. "bigint"
	generated bool
}

// tableInfo is what the catalog says about a table.
type tableInfo struct {
	ident   pgx.Identifier
	columns []column
	// primaryKey is the primary key's columns in key order; nil without one.
	primaryKey []string
	// uniques are the column sets of the plain unique indexes (primary
	// key included): no predicate, no expression.
	uniques [][]string
	// changeIndexed reports whether an index starts with the change column.
	changeIndexed bool
}

func (t *tableInfo) column(name string) (column, bool) {
	for _, c := range t.columns {
		if c.name == name {
			return c, true
		}
	}
	return column{}, false
}

// describeTable reads the catalog entry of table (a sanitized identifier)
// on conn. changeColumn names the column whose indexes are looked for.
func describeTable(ctx context.Context, conn *pgx.Conn, ident pgx.Identifier, changeColumn string) (*tableInfo, error) {
	name := ident.Sanitize()
	var oid *uint32
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1)::oid`, name).Scan(&oid); err != nil {
		return nil, fmt.Errorf("look up table %s: %w", name, err)
	}
	if oid == nil {
		return nil, &schemaError{fmt.Sprintf("table %s does not exist", name)}
	}
	info := &tableInfo{ident: ident}
	rows, err := conn.Query(ctx, `
		SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attgenerated <> ''
		FROM pg_attribute a
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, *oid)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", name, err)
	}
	var c column
	if _, err := pgx.ForEachRow(rows, []any{&c.name, &c.typ, &c.generated}, func() error {
		info.columns = append(info.columns, c)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", name, err)
	}
	rows, err = conn.Query(ctx, `
		SELECT i.indisprimary, i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL,
		       ARRAY(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
		             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		             ORDER BY k.ord)::text[]
		FROM pg_index i WHERE i.indrelid = $1 AND i.indisvalid`, *oid)
	if err != nil {
		return nil, fmt.Errorf("read indexes of %s: %w", name, err)
	}
	var primary, unique bool
	var cols []string
	if _, err := pgx.ForEachRow(rows, []any{&primary, &unique, &cols}, func() error {
		if primary {
			info.primaryKey = slices.Clone(cols)
		}
		if unique {
			info.uniques = append(info.uniques, slices.Clone(cols))
		}
		if len(cols) > 0 && cols[0] == changeColumn {
			info.changeIndexed = true
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read indexes of %s: %w", name, err)
	}
	return info, nil
}

// schemaError is a source or target whose tables do not fit the params.
type schemaError struct{ msg string }

func (e *schemaError) Error() string { return e.msg }

// plan is a replication's statements, built from the params and the
// catalogs of both tables.
type plan struct {
	keys []string
	// columns are the columns copied: the target's (not generated) that
	// the source has too, the change column first.
	columns []string
	// Source side: setSQL sets the bounds of the next batch as settings of
	// the session (COPY takes no parameters), readSQL copies the batch out.
	setSQL, filterSQL, readSQL string
	hasFilter                  bool
	filterValue                string
	// Target side: tempSQL creates the session's batch table, copyInSQL
	// loads a batch into it, upsertSQL and deleteSQL apply it.
	tempSQL, copyInSQL, upsertSQL, deleteSQL string
	headSQL                                  string
	// nullsSQL tells whether some source rows have no change value.
	nullsSQL      string
	changeIndexed bool
	// warnings are things that work but slowly (no index on the change
	// column).
	warnings []string
}

// deletedColumn is the column of the batch table that flags tombstones.
const deletedColumn = "__stint_deleted"

// makePlan checks the tables against p and builds the statements. Every
// identifier is quoted with pgx.Identifier.Sanitize (type names come from
// the catalog's format_type); values are parameters or, for the COPY
// statements, which take none, session settings set by parameterized
// set_config calls.
func makePlan(p Params, src, dst *tableInfo) (*plan, error) {
	keys, err := planKeys(p, src, dst)
	if err != nil {
		return nil, err
	}
	pl := &plan{keys: keys}
	if pl.columns, err = planColumns(p, src, dst, keys); err != nil {
		return nil, err
	}
	if err := pl.readStatements(p, src); err != nil {
		return nil, err
	}
	pl.writeStatements(p, dst)
	pl.changeIndexed = src.changeIndexed
	if !src.changeIndexed {
		pl.warnings = append(pl.warnings, fmt.Sprintf("source table %s has no index on its change column %q: every batch scans the table (InstallChangeTrigger creates one)", src.ident.Sanitize(), p.ChangeColumn))
	}
	return pl, nil
}

// planKeys checks the change columns and returns the key columns: those
// named in p, or the target's primary key.
func planKeys(p Params, src, dst *tableInfo) ([]string, error) {
	chg, ok := src.column(p.ChangeColumn)
	if !ok {
		return nil, &schemaError{fmt.Sprintf("source table %s has no change column %q", src.ident.Sanitize(), p.ChangeColumn)}
	}
	if chg.typ != "bigint" {
		return nil, &schemaError{fmt.Sprintf("change column %q of source table %s is %s, not bigint", p.ChangeColumn, src.ident.Sanitize(), chg.typ)}
	}
	if c, ok := dst.column(p.ChangeColumn); !ok || c.typ != "bigint" || c.generated {
		return nil, &schemaError{fmt.Sprintf("target table %s needs the change column %q as a plain bigint column", dst.ident.Sanitize(), p.ChangeColumn)}
	}
	if _, ok := dst.column(deletedColumn); ok {
		return nil, &schemaError{fmt.Sprintf("target table %s has a column named %q, which the replication uses itself", dst.ident.Sanitize(), deletedColumn)}
	}
	keys := p.KeyColumns
	if len(keys) == 0 {
		if len(dst.primaryKey) == 0 {
			return nil, &schemaError{fmt.Sprintf("target table %s has no primary key; add one or name key_columns", dst.ident.Sanitize())}
		}
		keys = dst.primaryKey
	} else if !slices.ContainsFunc(dst.uniques, func(u []string) bool { return sameSet(u, keys) }) {
		return nil, &schemaError{fmt.Sprintf("target table %s has no unique index on exactly the key columns %v", dst.ident.Sanitize(), keys)}
	}
	// A key must identify one source row, or a batch could hold a key
	// twice: the source needs a unique index on some of the key columns.
	if !slices.ContainsFunc(src.uniques, func(u []string) bool { return subset(u, keys) }) {
		return nil, &schemaError{fmt.Sprintf("source table %s has no primary key or unique index within the key columns %v", src.ident.Sanitize(), keys)}
	}
	return slices.Clone(keys), nil
}

// planColumns returns the columns to copy: the change column, then every
// target column that the source has and that is not generated.
func planColumns(p Params, src, dst *tableInfo, keys []string) ([]string, error) {
	columns := []string{p.ChangeColumn}
	for _, c := range dst.columns {
		if c.generated || c.name == p.ChangeColumn {
			continue
		}
		if sc, ok := src.column(c.name); ok {
			if sc.generated && slices.Contains(keys, c.name) {
				// Generated source columns are copied as values.
				return nil, &schemaError{fmt.Sprintf("key column %q of source table %s is generated", c.name, src.ident.Sanitize())}
			}
			columns = append(columns, c.name)
		}
	}
	for _, k := range keys {
		if _, ok := src.column(k); !ok {
			return nil, &schemaError{fmt.Sprintf("source table %s has no key column %q", src.ident.Sanitize(), k)}
		}
		if !slices.Contains(columns, k) {
			return nil, &schemaError{fmt.Sprintf("key column %q of target table %s is generated or missing", k, dst.ident.Sanitize())}
		}
	}
	return columns, nil
}

// quoteIdent quotes one identifier.
func quoteIdent(name string) string { return pgx.Identifier{name}.Sanitize() }

// columnList is the plan's columns, quoted and comma-separated.
func (pl *plan) columnList() string {
	cols := make([]string, len(pl.columns))
	for i, c := range pl.columns {
		cols[i] = quoteIdent(c)
	}
	return strings.Join(cols, ", ")
}

// readStatements builds the statements that read the source: the session
// settings, the batch COPY, the head and the null check.
func (pl *plan) readStatements(p Params, src *tableInfo) error {
	q := quoteIdent
	srcName, chgQ, colList := src.ident.Sanitize(), q(p.ChangeColumn), pl.columnList()
	// The deleted flag of a row: a true boolean tombstone, or any non-null
	// value of another type.
	deleted := "false"
	if p.TombstoneColumn != "" {
		tomb, ok := src.column(p.TombstoneColumn)
		if !ok {
			return &schemaError{fmt.Sprintf("source table %s has no tombstone column %q", srcName, p.TombstoneColumn)}
		}
		if tomb.typ == "boolean" {
			deleted = "coalesce(" + q(tomb.name) + ", false)"
		} else {
			deleted = q(tomb.name) + " IS NOT NULL"
		}
	}
	where := chgQ + " > current_setting('stint.repl_after')::bigint AND " + chgQ + " <= current_setting('stint.repl_upto')::bigint"
	if p.Filter != nil {
		fc, ok := src.column(p.Filter.Column)
		if !ok {
			return &schemaError{fmt.Sprintf("source table %s has no filter column %q", srcName, p.Filter.Column)}
		}
		pl.hasFilter, pl.filterValue = true, p.Filter.Value
		pl.filterSQL = `SELECT CAST($1::text AS ` + fc.typ + `), set_config('stint.repl_filter', $1, false)`
		where += " AND " + q(fc.name) + " = CAST(current_setting('stint.repl_filter') AS " + fc.typ + ")"
	}
	pl.setSQL = `SELECT set_config('stint.repl_after', $1, false), set_config('stint.repl_upto', $2, false),
		set_config('stint.repl_limit', $3, false)`
	// One COPY per batch: the rows in change order, the change value
	// first, the tombstone flag last.
	pl.readSQL = `COPY (SELECT ` + colList + `, ` + deleted + ` FROM ` + srcName + `
		WHERE ` + where + ` ORDER BY ` + chgQ + ` LIMIT current_setting('stint.repl_limit')::bigint) TO STDOUT`
	pl.headSQL = headSQL(srcName, chgQ)
	pl.nullsSQL = `SELECT EXISTS (SELECT 1 FROM ` + srcName + ` WHERE ` + chgQ + ` IS NULL)`
	return nil
}

// writeStatements builds the statements that write a batch to the
// target: through a temporary table, an upsert of the live rows and a
// delete of the tombstoned ones, each only where the target's row is
// older.
func (pl *plan) writeStatements(p Params, dst *tableInfo) {
	q := quoteIdent
	dstName, chgQ, colList, keys := dst.ident.Sanitize(), q(p.ChangeColumn), pl.columnList(), pl.keys
	const batchTable = "pg_temp.stint_repl_batch"
	pl.tempSQL = `CREATE TEMP TABLE stint_repl_batch ON COMMIT DELETE ROWS AS
		SELECT ` + colList + `, false AS ` + q(deletedColumn) + ` FROM ` + dstName + ` WITH NO DATA`
	pl.copyInSQL = `COPY ` + batchTable + ` FROM STDIN`
	var sets []string
	for _, c := range pl.columns {
		if !slices.Contains(keys, c) {
			sets = append(sets, q(c)+" = excluded."+q(c))
		}
	}
	keyQ := make([]string, len(keys))
	var keyMatch []string
	for i, k := range keys {
		keyQ[i] = q(k)
		keyMatch = append(keyMatch, "t."+q(k)+" = r."+q(k))
	}
	pl.upsertSQL = `
INSERT INTO ` + dstName + ` AS t (` + colList + `) OVERRIDING SYSTEM VALUE
SELECT ` + colList + ` FROM ` + batchTable + ` WHERE NOT ` + q(deletedColumn) + `
ON CONFLICT (` + strings.Join(keyQ, ", ") + `) DO UPDATE SET ` + strings.Join(sets, ", ") + `
WHERE t.` + chgQ + ` < excluded.` + chgQ
	pl.deleteSQL = `
DELETE FROM ` + dstName + ` AS t USING ` + batchTable + ` AS r
WHERE r.` + q(deletedColumn) + ` AND ` + strings.Join(keyMatch, " AND ") + ` AND t.` + chgQ + ` <= r.` + chgQ
}

// subset reports whether every string of a is in b.
func subset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return len(a) > 0
}

// headSQL returns the statement that reads the source's head: the highest
// change value visible in the statement's snapshot, and the transactions
// of the source database that are running after that snapshot was taken
// (ids of top-level transactions, prepared ones included). The snapshot is
// taken when the statement starts; the activity view is read while it
// runs, so every transaction that took a change value before the snapshot
// and has not ended is in the list.
func headSQL(table, changeColumn string) string {
	return `
SELECT (SELECT max(` + changeColumn + `) FROM ` + table + `),
       ARRAY(SELECT a.backend_xid::text FROM pg_stat_activity a
             WHERE a.datname = current_database() AND a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()
             UNION
             SELECT p.transaction::text FROM pg_prepared_xacts p WHERE p.database = current_database())`
}

// stillRunningSQL returns those of the transactions $1 that have not ended.
const stillRunningSQL = `
SELECT ARRAY(SELECT x FROM unnest($1::text[]) x
             WHERE x::xid IN (SELECT backend_xid FROM pg_stat_activity WHERE backend_xid IS NOT NULL)
                OR x::xid IN (SELECT transaction FROM pg_prepared_xacts))`

// checkNulls adds a warning to the plan when source rows have no change
// value (they are never replicated). It looks only when the change column
// is indexed, so that it never scans the table.
func checkNulls(ctx context.Context, conn *pgx.Conn, pl *plan) error {
	if !pl.changeIndexed {
		return nil
	}
	var nulls bool
	if err := conn.QueryRow(ctx, pl.nullsSQL).Scan(&nulls); err != nil {
		return fmt.Errorf("look for rows without a change value: %w", err)
	}
	if nulls {
		pl.warnings = append(pl.warnings, "some source rows have no change value and are not replicated (InstallChangeTrigger gives every row one)")
	}
	return nil
}

// source reads a replication's source table.
type source struct {
	conn *pgx.Conn
	plan *plan
	// waiting, when set, is called when horizon starts waiting for n
	// running transactions.
	waiting func(n int)
}

// prepare sets the session up for reading batches: the output formats the
// target parses, and the filter value.
func (s *source) prepare(ctx context.Context) error {
	if s.plan.hasFilter {
		if _, err := s.conn.Exec(ctx, s.plan.filterSQL, s.plan.filterValue); err != nil {
			return &schemaError{fmt.Sprintf("filter value %q does not fit its column: %v", s.plan.filterValue, err)}
		}
	}
	return nil
}

// horizon returns the highest change value at or below which every row
// is committed (see the package documentation), waiting for the
// transactions that may still hold lower values. If the visible head is
// not above last, it returns it at once: nothing new can be missed there,
// since all values at or below last were settled when last was reached.
func (s *source) horizon(ctx context.Context, last int64) (int64, error) {
	var head *int64
	var running []string
	if err := s.conn.QueryRow(ctx, s.plan.headSQL).Scan(&head, &running); err != nil {
		return 0, fmt.Errorf("read the source's head: %w", err)
	}
	h := int64(0)
	if head != nil {
		h = *head
	}
	if h <= last {
		return h, nil
	}
	if len(running) > 0 && s.waiting != nil {
		s.waiting(len(running))
	}
	wait := 2 * time.Millisecond
	for len(running) > 0 {
		if err := spi.Sleep(ctx, wait); err != nil {
			return 0, err
		}
		wait = min(wait*2, 100*time.Millisecond)
		if err := s.conn.QueryRow(ctx, stillRunningSQL, running).Scan(&running); err != nil {
			return 0, fmt.Errorf("wait for the source's running transactions: %w", err)
		}
	}
	return h, nil
}

// batch is one batch of source rows in COPY text format: one line per
// row, the change value first.
type batch struct {
	count   int
	lastSeq int64
	data    []byte
}

// read returns up to n rows with change values in (after, upTo], in change
// order.
func (s *source) read(ctx context.Context, after, upTo int64, n int) (batch, error) {
	var b batch
	if _, err := s.conn.Exec(ctx, s.plan.setSQL, strconv.FormatInt(after, 10), strconv.FormatInt(upTo, 10), strconv.Itoa(n)); err != nil {
		return b, fmt.Errorf("read source rows after change %d: %w", after, err)
	}
	var buf bytes.Buffer
	if _, err := s.conn.PgConn().CopyTo(ctx, &buf, s.plan.readSQL); err != nil {
		return b, fmt.Errorf("read source rows after change %d: %w", after, err)
	}
	b.data = buf.Bytes()
	b.count = bytes.Count(b.data, []byte{'\n'})
	if b.count > 0 {
		last := b.data[:len(b.data)-1]
		last = last[bytes.LastIndexByte(last, '\n')+1:]
		if i := bytes.IndexByte(last, '\t'); i >= 0 {
			last = last[:i]
		}
		v, err := strconv.ParseInt(string(last), 10, 64)
		if err != nil {
			return b, fmt.Errorf("read source rows after change %d: bad change value %q", after, last)
		}
		b.lastSeq = v
	}
	return b, nil
}

// sameSet reports whether a and b hold the same strings.
func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// errIsSchema reports whether err is a schemaError.
func errIsSchema(err error) bool {
	var se *schemaError
	return errors.As(err, &se)
}
