# JupyterHub's configuration for a Claim Lab training room.
#
# Start it with `sudo make hub` (or `labkit hub start --trainees N [--mode shared --dsn ADMIN_DSN]`),
# which first sets the room up in .hub/ (beside this folder): the room's mode and size, its
# passwords (files of mode 0600), one system user per trainee with the workbook in
# ~/claimlab, and JupyterHub's proxy from npm.  What this file asks of JupyterHub, in words:
#
#   * log-in: JupyterHub's shared-password authenticator; trainees are trainee01 .. traineeNN,
#     the presenter is `presenter` (an admin, with a password of their own);
#   * each trainee's server: JupyterHub's LocalProcessSpawner, run as the trainee's own system
#     user (claimlab-trainee01 ...), opening notebook 00 from their copy of the workbook;
#   * where their PostgreSQL comes from: their own embedded server (mode embedded), or their
#     own login role on one shared server, handed to them as LABKIT_DSN (mode shared).
#
# labkit.tools.hub.configure() holds the settings, so that `labkit hub` and this file agree;
# set anything of your own below it (c.JupyterHub.ssl_cert, c.Spawner.mem_limit, ...).

from labkit.tools.hub import configure

configure(c)  # noqa: F821 -- JupyterHub defines c
