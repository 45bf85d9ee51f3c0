package zclaimvet

// IgnoredOut is where packages say how many reviewed sites they left out.
var IgnoredOut = &ignoredOut
