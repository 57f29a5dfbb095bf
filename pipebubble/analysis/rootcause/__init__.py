"""Why a rank is late, across ranks: each late arrival at a collective followed to what delayed it.

``part`` (map, per file or batch of rank files): per arrival at communication, its step, the step's start and
the time in each class (GPU compute / exposed comm / idle; host loader / sync / operators / idle) since then.
``late`` (reduce): at each matched call, the last arrival's lateness split into entered late and inside, the
inside part given to the class it exceeds its peers' median by most. ``chain``: a late rank held by a wait of
its own is followed to the rank it waited for. ``result``: one ``LateRank`` per late rank; ``findings``: they
as ``late_rank`` / ``data_loader`` findings.
"""
