-- The inventory of the ingest behaviors (behaviors/ingest): one row per
-- stored object version and one per file in it. A job's recording stage
-- writes its rows in the same transaction as its stage checkpoint, so the
-- inventory never holds an object whose job has not recorded it, and a
-- retried stage never writes it twice.
CREATE TABLE stint_ingest_object (
    identifier   text        NOT NULL,
    version      integer     NOT NULL CHECK (version > 0),
    job_id       text        NOT NULL UNIQUE,
    batch_id     text        NOT NULL,
    profile      text        NOT NULL,
    submitter    text        NOT NULL,
    local_id     text,
    file_count   integer     NOT NULL,
    total_bytes  bigint      NOT NULL,
    storage_path text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (identifier, version)
);

CREATE INDEX stint_ingest_object_batch ON stint_ingest_object (batch_id);
CREATE INDEX stint_ingest_object_local ON stint_ingest_object (profile, local_id) WHERE local_id IS NOT NULL;

CREATE TABLE stint_ingest_file (
    identifier   text   NOT NULL,
    version      integer NOT NULL,
    name         text   NOT NULL,
    size         bigint NOT NULL,
    sha256       text   NOT NULL,
    -- The digest the manifest gave, if any, verified at download.
    digest_alg   text,
    digest       text,
    source_url   text   NOT NULL,
    storage_path text   NOT NULL,
    PRIMARY KEY (identifier, version, name),
    FOREIGN KEY (identifier, version) REFERENCES stint_ingest_object (identifier, version) ON DELETE CASCADE
);

-- Server nodes run the ingest behaviors (when the roles exist; see the
-- core migration roles).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'stint_node') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON stint_ingest_object, stint_ingest_file TO stint_node;
    END IF;
END
$$;
