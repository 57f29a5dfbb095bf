"""Communication across ranks: collectives and point-to-point operations matched between participants,
and the one clock for the job estimated from them."""
