package replication

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Beginner is what InstallChangeTrigger needs of a connection: a
// *pgx.Conn, a *pgxpool.Pool or a pgx.Tx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ChangeTrigger names what InstallChangeTrigger created.
type ChangeTrigger struct {
	// Sequence, Function, Trigger and Index are the objects' names, in
	// the table's schema.
	Sequence, Function, Trigger, Index string
	// Backfilled counts the existing rows that got a change value.
	Backfilled int64
}

// InstallChangeTrigger makes column of table (a name or "schema.table") a
// change column: a bigint set from a sequence on every insert and update,
// as a replication needs. In one transaction it adds the column if the
// table lacks it (it must be a bigint if it exists), creates the sequence
// (cache 1, so that values are handed out in order across sessions), the
// trigger function and a BEFORE INSERT OR UPDATE row trigger, gives every
// row without a change value one, and creates an index on the column. It
// may be run again: existing objects are kept or replaced. The trigger
// assigns the writing transaction its id before it takes a change value,
// which is what lets a replication tell when every value below a point is
// committed. Creating the index and backfilling lock the table against
// writes while they run.
func InstallChangeTrigger(ctx context.Context, conn Beginner, table, column string) (ChangeTrigger, error) {
	var out ChangeTrigger
	ident, err := parseTable(table)
	if err != nil {
		return out, fmt.Errorf("install change trigger: table: %w", err)
	}
	if err := checkColumn(column); err != nil {
		return out, fmt.Errorf("install change trigger: column: %w", err)
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var schema, rel string
		err := tx.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.oid = to_regclass($1)`, ident.Sanitize()).Scan(&schema, &rel)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("table %s does not exist", ident.Sanitize())
		}
		if err != nil {
			return err
		}
		tbl := pgx.Identifier{schema, rel}.Sanitize()
		var typ *string
		if err := tx.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
			WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 AND NOT attisdropped`, tbl, column).Scan(&typ); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		switch {
		case typ == nil:
			if _, err := tx.Exec(ctx, `ALTER TABLE `+tbl+` ADD COLUMN `+pgx.Identifier{column}.Sanitize()+` bigint`); err != nil {
				return fmt.Errorf("add column: %w", err)
			}
		case *typ != "bigint":
			return fmt.Errorf("column %q of %s is %s, not bigint", column, tbl, *typ)
		}
		base := rel + "_" + column + "_stint"
		if len(base) > 48 {
			h := sha256.Sum256([]byte(rel + "\x00" + column))
			base = "stint_change_" + hex.EncodeToString(h[:8])
		}
		out = ChangeTrigger{Sequence: base + "_seq", Function: base + "_fn", Trigger: base, Index: base + "_idx"}
		seq := pgx.Identifier{schema, out.Sequence}.Sanitize()
		if _, err := tx.Exec(ctx, `CREATE SEQUENCE IF NOT EXISTS `+seq+` AS bigint CACHE 1 NO CYCLE`); err != nil {
			return fmt.Errorf("create sequence: %w", err)
		}
		var ddl string
		if err := tx.QueryRow(ctx, `SELECT format($f$CREATE OR REPLACE FUNCTION %I.%I() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    -- The transaction id first, then the change value (see package
    -- github.com/stinthq/stint/behaviors/replication).
    PERFORM pg_current_xact_id();
    NEW.%I := nextval(%L);
    RETURN NEW;
END
$body$$f$, $1::text, $2::text, $3::text, $4::text)`, schema, out.Function, column, seq).Scan(&ddl); err != nil {
			return fmt.Errorf("build trigger function: %w", err)
		}
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("create trigger function: %w", err)
		}
		trg := pgx.Identifier{out.Trigger}.Sanitize()
		fn := pgx.Identifier{schema, out.Function}.Sanitize()
		if _, err := tx.Exec(ctx, `DROP TRIGGER IF EXISTS `+trg+` ON `+tbl); err != nil {
			return fmt.Errorf("replace trigger: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TRIGGER `+trg+` BEFORE INSERT OR UPDATE ON `+tbl+` FOR EACH ROW EXECUTE FUNCTION `+fn+`()`); err != nil {
			return fmt.Errorf("create trigger: %w", err)
		}
		col := pgx.Identifier{column}.Sanitize()
		tag, err := tx.Exec(ctx, `UPDATE `+tbl+` SET `+col+` = NULL WHERE `+col+` IS NULL`)
		if err != nil {
			return fmt.Errorf("backfill change values: %w", err)
		}
		out.Backfilled = tag.RowsAffected()
		if _, err := tx.Exec(ctx, `CREATE INDEX IF NOT EXISTS `+pgx.Identifier{out.Index}.Sanitize()+` ON `+tbl+` (`+col+`)`); err != nil {
			return fmt.Errorf("create index: %w", err)
		}
		return nil
	})
	if err != nil {
		return ChangeTrigger{}, fmt.Errorf("install change trigger on %s.%s: %w", table, column, err)
	}
	return out, nil
}
