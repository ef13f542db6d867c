// Which host storages pending ops have made not resizable, and for how many ops each: a
// storage shared by two pending ops (two views of one tensor, an in-place op's input and
// output) is made resizable again by the last of them to end, not the first, which left it
// resizable under the other while the transport still wrote into it (TransportWork::
// pinStorages). Process-wide, any thread.
#pragma once

#include <c10/core/Storage.h>

namespace ucxb {

// Pins `storage` for one more op and returns true, or returns false and leaves it alone when
// it is not resizable and no op pinned it (numpy's memory, a storage made so by its owner).
// The caller keeps `storage` until it calls unpinStorage() with it: the count is keyed by the
// storage's address.
bool pinStorage(const c10::Storage& storage);
// Gives back one op's pin of `storage` (pinStorage returned true); the last one makes it
// resizable again.
void unpinStorage(const c10::Storage& storage);

}  // namespace ucxb
