"""Several servers, one spec (issue 19): the cluster file, DC placement, SSH control, clocks.

Layers, each its own module:

* :mod:`.model` -- the cluster file (``servers:``, ``placement:``, ``mode:``), validated in one place;
* :mod:`.placement` -- which server holds which DC (given, or automatic: balance the emulated nodes, keep each
  DC on one server, cut as few WAN links as possible);
* :mod:`.remote` -- commands on a server over OpenSSH only (one multiplexed connection per server), with errors
  that name the server and the fix;
* :mod:`.clock` -- each server's wall-clock offset from the launcher's, measured over that connection, so
  records from several servers can be merged on one time axis.

What is built so far is the control plane (the spec, placement, reachability and clock offsets: ``testbed
cluster place | check``).  Running emulated hosts or shaping real egress on remote servers is not built yet;
the README's "Several servers" section says what is and is not there.
"""
