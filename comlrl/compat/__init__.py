"""Everything that translates comlrl 1.4.3 into this library, in one place: its module paths
(:mod:`~comlrl.compat.paths`) and the names it had that we lack (:mod:`~comlrl.compat.moved`).
The engine below speaks one language; what a 1.4.3 script writes is turned into it here, at
the edge, with the meaning it had there, or refused with an error that names what to write."""
