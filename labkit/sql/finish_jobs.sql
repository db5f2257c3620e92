-- The second short transaction: record the terminal state.
-- Only jobs this worker still owns are marked; a claim the reaper has taken back
-- (and maybe handed to someone else) matches no row, and the worker learns it lost it.
UPDATE job
   SET status = 'DONE'
 WHERE id = ANY(%(ids)s)
   AND status = 'IN_PROGRESS'
   AND worker_id = %(worker_id)s
RETURNING id;
