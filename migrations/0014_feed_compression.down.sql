ALTER TABLE stint_change
    ALTER COLUMN finals SET COMPRESSION default,
    ALTER COLUMN progresses SET COMPRESSION default;
