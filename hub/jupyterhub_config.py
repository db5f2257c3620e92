# JupyterHub's configuration for a Claim Lab training room.
#
# Start it with `sudo make hub` (or `labkit hub start --trainees N [--mode shared]`), which
# first sets the room up in .hub/ (beside this folder): the room's mode and size, a password
# for each trainee and for the presenter (a file of mode 0600, and a handout), one system
# user per trainee with the workbook in ~/claimlab, and JupyterHub's proxy from npm.  What
# this file asks of JupyterHub, in words:
#
#   * log-in: each name with its own password only: trainee01 .. traineeNN, and `presenter`
#     (the hub's admin, who lands on the admin page);
#   * each trainee's server: JupyterHub's LocalProcessSpawner, run as the trainee's own system
#     user (claimlab-trainee01 ...), opening notebook 00 from their copy of the workbook;
#   * where their PostgreSQL comes from: their own embedded server (mode embedded), or their
#     own login role on one shared server, handed to them as LABKIT_DSN (mode shared).
#
# The room's settings come from labkit.tools.hub.configure(); add your own below it (c.JupyterHub.ssl_cert and c.JupyterHub.ssl_key for
# HTTPS, c.JupyterHub.bind_url, ...).

from labkit.tools.hub import configure

configure(c)  # noqa: F821 -- JupyterHub defines c
