"""How long a test waits for something that must happen (a process to exit, a server to answer,
a thread to finish): a bound on a hang, not on a busy machine. On a shared 2-core machine at a
load of 3x its cores, a fuzz request outlasted a 30 s client timeout and a core process took
over 60 s to stop at start-up, though nothing was wrong; a test waits until the event, so a
long bound costs a passing test nothing."""

WAIT_S = 300
