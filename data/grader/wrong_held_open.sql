-- Wrong: the claim's transaction stays open while the job runs (no COMMIT).
BEGIN;
SELECT id FROM job WHERE status = 'PENDING'
 ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED;
