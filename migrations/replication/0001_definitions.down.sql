DROP TABLE IF EXISTS stint_replication;
