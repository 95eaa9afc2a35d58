"""Several servers, one spec (issue 19): the cluster file, DC placement, SSH control, clocks, trials.

Layers, each its own module:

* :mod:`.model` -- the cluster file (``servers:``, ``placement:``, ``mode:``), validated in one place;
* :mod:`.placement` -- which server holds which DC (given, or automatic: balance the emulated nodes per core, keep each
  DC on one server, cut as few WAN links as possible);
* :mod:`.capacity` -- each server's cores, measured over ssh where the file does not give them;
* :mod:`.remote` -- commands on a server over OpenSSH only (one multiplexed connection per server), with errors
  that name the server and the fix;
* :mod:`.clock` -- each server's wall-clock offset from the launcher's, measured over that connection, so
  records from several servers can be merged on one time axis;
* :mod:`.tunnel` -- a WAN link between DCs on different servers as a VXLAN interface in each end's router
  namespace, and the ``Part`` of a network one server builds;
* :mod:`.launch` -- emulate mode: every server builds its part (remote ones over ssh), and takes it down;
* :mod:`.view` -- the network across servers as one (the full plan; a node's command runs on its server);
* :mod:`.verify` -- ``net verify --cluster``: the one-machine measurements across servers, each server's
  read-back;
* :mod:`.trialnet` -- a trial's network across servers: trainers over ssh, records fetched back, clocks
  corrected;
* :mod:`.sampling` -- what another server samples during a trial (links, TCP, its trainers, its CPU);
* :mod:`.show` -- ``net show --cluster``: every server's own report, asked at once and merged;
* :mod:`.linkset` -- a link change (``net set --cluster``, a schedule's event) on every server at once;
* :mod:`.shaping` -- shape mode's plan: one server per DC with hosts, one shaped path per DC pair;
* :mod:`.shaper` -- shape mode on one server: its own traffic to each other DC through a shaping namespace;
* :mod:`.shapeset` -- shape mode's link change (``net set --cluster``, a schedule's event): every path over the
  link recomposed, checked, then applied on every server.

Built so far: the cluster file, placement, reachability and clock checks (``testbed cluster place | check``);
both modes' networks (``testbed net up | down | show | verify --cluster``), trials and sweeps across them (``testbed
run | sweep --cluster``) with every server sampled; ``net set --cluster`` (link down/up too) and link schedules
in both modes, cross traffic across servers in both modes; automatic placement by nodes per core.  Docker hosts
across servers are refused; the README's "Several servers" section says what is and is not there.
"""
