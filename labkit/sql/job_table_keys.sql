-- Per-key ordering: every job belongs to a customer, and one customer's jobs
-- must run one at a time, oldest first.
ALTER TABLE job ADD COLUMN customer text;
CREATE INDEX job_customer_created_idx ON job (customer, created_at);
