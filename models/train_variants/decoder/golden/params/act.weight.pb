B
act.weightJ „¶„>x,‚>Θu>χώu>mF„>Φ9…>ζ5…>)μt>