DROP TABLE IF EXISTS stint_attempt;
