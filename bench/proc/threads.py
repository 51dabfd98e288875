"""Hold N idle threads (each blocked on an Event); write READY_FILE when they exist; run until killed."""
import sys
import threading

n, ready = int(sys.argv[1]), sys.argv[2]
stop = threading.Event()
threading.stack_size(64 * 1024)
for _ in range(n):
    threading.Thread(target=stop.wait, daemon=True).start()
with open(ready, "w") as f:
    f.write("ready\n")
stop.wait()
