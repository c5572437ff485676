"""What the controllers share: the harness both kinds run in (controller.py) and the snapshot of an object it
keeps (snapshot.py), informers, the keyed work queue, status writes, leader election, operator-wide defaults."""
