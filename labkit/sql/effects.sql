-- Two side effects a job handler can have, kept outside the claim's transaction
-- (each is written on a connection of its own, like a call to another system).
-- effect_log: every run appends a row: an e-mail sent, a balance credited. Not idempotent.
CREATE TABLE effect_log (
    n          bigserial   PRIMARY KEY,
    job_id     bigint      NOT NULL,
    worker_id  text        NOT NULL
);
-- effect_once: the job id is a unique key, so a second run of the same job is absorbed.
CREATE TABLE effect_once (
    job_id     bigint      PRIMARY KEY,
    worker_id  text        NOT NULL
);
