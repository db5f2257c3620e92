-- Wrong: locks, but marks nothing. The lock ends with the (auto-committed)
-- statement and the job is PENDING again for the next worker.
SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED;
