DROP TABLE IF EXISTS stint_ingest_file;
DROP TABLE IF EXISTS stint_ingest_object;
