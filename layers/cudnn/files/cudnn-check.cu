// nodeforge's cuDNN check, compiled by the cuDNN devel image and run in the cuDNN runtime image:
//   nvcc -cudart shared -o cudnn-check cudnn-check.cu -lcudnn
// It prints the cuDNN it loaded and the CUDA runtime that cuDNN was built against (calls that
// need no device: proof that the dynamic linker found libcudnn and its symbols resolve). Then,
// like cuda-check, without a GPU (or a driver) it reports the CUDA error and exits with its
// number: cudaErrorNoDevice (100) or cudaErrorInsufficientDriver (35). With a GPU it runs a ReLU
// forward pass over a small tensor, checks every result and exits 0 (1 when a result is wrong,
// 2 when a cuDNN call fails).
#include <cstdio>
#include <cuda_runtime.h>
#include <cudnn.h>

static int fail(const char *what, cudaError_t err) {
  printf("%s: %s (%d): %s\n", what, cudaGetErrorName(err), (int)err, cudaGetErrorString(err));
  return (int)err;
}

static int cudnn_failed(const char *what, cudnnStatus_t s) {
  printf("cuDNN %s FAILED: %s (%d)\n", what, cudnnGetErrorString(s), (int)s);
  return 2;
}

int main() {
  size_t version = cudnnGetVersion(), cudart = cudnnGetCudartVersion();
  printf("cuDNN %zu.%zu.%zu (built against cudart %zu.%zu)\n", version / 10000, version % 10000 / 100,
         version % 100, cudart / 1000, cudart % 1000 / 10);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return fail("cudaGetDeviceCount", err);
  if (count == 0) return fail("cudaGetDeviceCount", cudaErrorNoDevice);

  cudnnHandle_t handle;
  cudnnStatus_t s = cudnnCreate(&handle);
  if (s != CUDNN_STATUS_SUCCESS) return cudnn_failed("cudnnCreate", s);
  const int n = 1 << 16;
  float *x, *y;
  if ((err = cudaMallocManaged(&x, n * sizeof(float))) != cudaSuccess) return fail("cudaMallocManaged", err);
  if ((err = cudaMallocManaged(&y, n * sizeof(float))) != cudaSuccess) return fail("cudaMallocManaged", err);
  for (int i = 0; i < n; i++) { x[i] = (float)(i - n / 2); y[i] = -1.0f; }
  cudnnTensorDescriptor_t desc;
  cudnnActivationDescriptor_t relu;
  cudnnCreateTensorDescriptor(&desc);
  cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 1, n);
  cudnnCreateActivationDescriptor(&relu);
  cudnnSetActivationDescriptor(relu, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0);
  const float one = 1.0f, zero = 0.0f;
  s = cudnnActivationForward(handle, relu, &one, desc, x, &zero, desc, y);
  cudaDeviceSynchronize();
  cudnnDestroyActivationDescriptor(relu);
  cudnnDestroyTensorDescriptor(desc);
  cudnnDestroy(handle);
  if (s != CUDNN_STATUS_SUCCESS) return cudnn_failed("cudnnActivationForward", s);
  int wrong = 0;
  for (int i = 0; i < n; i++) wrong += y[i] != (x[i] > 0.0f ? x[i] : 0.0f);
  cudaFree(x);
  cudaFree(y);
  if (wrong) {
    printf("cuDNN ReLU FAILED: %d of %d results wrong\n", wrong, n);
    return 1;
  }
  printf("cuDNN ReLU ok: %d results checked\n", n);
  return 0;
}
