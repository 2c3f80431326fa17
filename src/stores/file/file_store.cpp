// Placeholder until the file store lands from its branch.
#include "stores/file/file_store.hpp"

namespace dlock::internal {

Result<std::shared_ptr<Store>> OpenFileStore(const ParsedUrl&, const StoreOptions&) {
  return UnimplementedError("the file:// store is not built yet");
}

}  // namespace dlock::internal
